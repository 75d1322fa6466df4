"""Code lines: a room of the code measured as DESIGN.md counts it, lines that hold
code (no docstrings, comments or blank lines).

    python tools/code_lines.py FILE[::CLASS] ...

prints each file's (or class's) count and the total. The rooms issue 44 measures:

    python tools/code_lines.py --rooms
"""
from __future__ import annotations

import ast
import io
import sys
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ROOMS = {
    "CPU packed products": ["tinypaged/kernels/cpu/lanes.py", "tinypaged/kernels/cpu/lane_packed.py",
                            "tinypaged/kernels/cpu/lanes_ir.py", "tinypaged/kernels/cpu/lanes_product.py",
                            "tinypaged/kernels/cpu/byte_dot.py", "tinypaged/kernels/cpu/vector_ir.py",
                            "tinypaged/kernels/cpu/kind_arg.py"],
    "the CUDA backend class": ["tinypaged/kernels/cuda/backend.py::CudaBackend"],
    "the engine step": [f"tinypaged/engine/{name}.py" for name in (
        "llm_engine", "scheduler", "model_runner", "sampler", "postprocessor", "step_plan", "step_outcome")],
}


def code_lines(source: str, within: tuple[int, int] | None = None) -> int:
    """Lines of source holding a token other than a comment or a docstring, in the
    line range `within` (1-based, inclusive) if given."""
    tree = ast.parse(source)
    docstrings = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) \
                and node.body and isinstance(node.body[0], ast.Expr) \
                and isinstance(node.body[0].value, ast.Constant) and isinstance(node.body[0].value.value, str):
            docstrings.update(range(node.body[0].lineno, node.body[0].end_lineno + 1))
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Attribute) \
                and node.targets[0].attr == "__doc__" and isinstance(node.value, ast.Constant):
            docstrings.update(range(node.lineno, node.end_lineno + 1))  # (f.__doc__ = "...": a docstring)
    lines = set()
    skip = (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
            tokenize.ENCODING, tokenize.ENDMARKER)
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type not in skip:
            lines.update(n for n in range(token.start[0], token.end[0] + 1) if n not in docstrings)
    if within is not None:
        lines = {n for n in lines if within[0] <= n <= within[1]}
    return len(lines)


def count(spec: str) -> int:
    """spec: a path relative to the repository, or PATH::CLASS."""
    path, _, cls = spec.partition("::")
    source = (ROOT / path).read_text(encoding="utf-8")
    if not cls:
        return code_lines(source)
    node = next(n for n in ast.parse(source).body if isinstance(n, ast.ClassDef) and n.name == cls)
    return code_lines(source, (node.lineno, node.end_lineno))


def main(argv: list[str]) -> None:
    rooms = ROOMS if argv == ["--rooms"] else {"files": argv}
    for room, specs in rooms.items():
        counts = {spec: count(spec) for spec in specs}
        for spec, n in counts.items():
            print(f"{n:6d}  {spec}")
        print(f"{sum(counts.values()):6d}  {room}\n")


if __name__ == "__main__":
    main(sys.argv[1:])
