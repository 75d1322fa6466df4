"""The rooms issue 44 measured, held to their budgets (tools/code_lines.py counts code
lines: no docstrings, comments or blank lines). A room that outgrows its budget has
taken on a second concept or a second copy of one: split it or share the copy."""
import ast
import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("code_lines", ROOT / "tools" / "code_lines.py")
code_lines = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(code_lines)

# (CPU packed products: 600, then 620 for the parallel loops that call the GEMV's and
# GEMM's items at their address, which cut a kind's first compile by ~3 s)
BUDGETS = {"CPU packed products": 620, "the CUDA backend class": 150, "the engine step": 550}
FAMILY_BUDGET = 80  # a family file, its math with it


@pytest.mark.parametrize("room", BUDGETS)
def test_each_room_is_within_its_budget(room):
    total = sum(code_lines.count(spec) for spec in code_lines.ROOMS[room])
    assert 0 < total <= BUDGETS[room], f"{room}: {total} code lines, budget {BUDGETS[room]}"


def test_each_family_file_is_within_its_budget():
    registry = ROOT / "tinypaged" / "model" / "families.py"  # the files it imports the families from
    modules = {node.module for node in ast.parse(registry.read_text()).body if isinstance(node, ast.ImportFrom)}
    files = [f"tinypaged/model/{module}.py" for module in sorted(modules)]
    assert len(files) >= 8
    for path in files:
        n = code_lines.count(path)
        assert n <= FAMILY_BUDGET, f"{path}: {n} code lines, budget {FAMILY_BUDGET}"


def test_what_counts_as_code():
    source = '''"""A module docstring."""
import os  # a comment


def f(x):
    """A docstring
    on two lines."""
    return x  # code

f.__doc__ = """An attached docstring
on two lines."""
'''
    assert code_lines.code_lines(source) == 3  # import, def, return


def _files_naming(names: set) -> dict:
    """name -> the package's files whose code (not comments or strings) names it."""
    import io
    import tokenize
    found = {name: set() for name in names}
    for path in (ROOT / "tinypaged").rglob("*.py"):
        for token in tokenize.generate_tokens(io.StringIO(path.read_text()).readline):
            if token.type == tokenize.NAME and token.string in names:
                found[token.string].add(str(path.relative_to(ROOT)))
    return found


# A kind's code lives in <= 4 files: its row of the kind table, its format (kquant.py
# for the K-quants, ggml_quant.py for the 32-value kinds; packed.py reads the table's
# attributes), and what differs in each backend's product (lanes_ir.py, the CUDA
# kernels). The engine and loaders name kinds through the table (QUANTIZE_TARGETS,
# REQUANTIZE_TO), never by their constants.
@pytest.mark.parametrize("kind", ["Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K"])
def test_a_kind_lives_in_at_most_four_files(kind):
    files = _files_naming({kind})[kind]
    assert "tinypaged/formats/quant_kind.py" in files
    assert len(files) <= 4, sorted(files)
