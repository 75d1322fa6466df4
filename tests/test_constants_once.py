"""One definition per constant: a module-level constant (an UPPER_CASE name) is
assigned in one module of the package only, and the constants that every kernel
shares live where the table below says. A second `LANES = 16` or `QK = 32` drifts
from the first the day one of them changes, and nothing else would notice."""
from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "tinypaged"
CONSTANT = re.compile(r"^_?[A-Z][A-Z0-9_]*$")

# the shared constants and their one home (relative to tinypaged/)
HOMES = {
    "QK": "formats/quant_kind.py",  # values a quantization block: every packed kind, x's int8 blocks
    "QK_K": "formats/quant_kind.py",  # values a K-quant super-block
    "LANES": "kernels/cpu/vector_ir.py",  # rows of W a lanes group: one 512-bit vector
    "WARP": "kernels/cuda/warp.py",  # threads a warp
    "NEG_INF": "kernels/cuda/exact.py",  # float32 -inf in CUDA kernels
    "LAYER_NAME": "formats/weight_dict.py",  # a layer's tensor-name prefix
}
# names each module may define for itself, and why
LOCAL_BY_NATURE = {
    "T": "a TypeVar, local to its module's annotations",
}


def module_constants(root: Path) -> dict[str, list[str]]:
    """UPPER_CASE name -> the modules (paths under root) that assign it at module level
    (plain, annotated, or tuple assignments)."""
    found = defaultdict(list)
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        names = set()
        for node in tree.body:
            targets = node.targets if isinstance(node, ast.Assign) else \
                [node.target] if isinstance(node, ast.AnnAssign) else []
            for target in targets:
                for leaf in ([target] if isinstance(target, ast.Name) else
                             target.elts if isinstance(target, ast.Tuple) else []):
                    if isinstance(leaf, ast.Name) and CONSTANT.match(leaf.id):
                        names.add(leaf.id)
        for name in names:
            found[name].append(path.relative_to(root).as_posix())
    return found


def defined_twice(root: Path) -> dict[str, list[str]]:
    return {name: where for name, where in module_constants(root).items()
            if len(where) > 1 and name not in LOCAL_BY_NATURE}


def test_every_constant_is_assigned_in_one_module():
    assert defined_twice(PACKAGE) == {}


def test_the_shared_constants_live_in_their_homes():
    found = module_constants(PACKAGE)
    assert {name: found.get(name) for name in HOMES} == {name: [home] for name, home in HOMES.items()}


def test_the_check_finds_a_second_definition(tmp_path):
    (tmp_path / "a.py").write_text("LANES = 16\nQK, OTHER = 32, 1\n")
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "c.py").write_text("from a import OTHER\nQK = 32\ndef f():\n    LANES = 8\n")
    (tmp_path / "d.py").write_text("T = 1\nQK: int = 32\n")
    (tmp_path / "e.py").write_text("T = 2\n")
    assert defined_twice(tmp_path) == {"QK": ["a.py", "b/c.py", "d.py"]}
