"""The layering DESIGN.md sets, checked against tinypaged's imports (issue 32, part 3).

Every import of a tinypaged module (at the top of a file or inside a function) is
read from the AST. A module may import its own layer and the layers below it,
never above; no import cycle may exist, function-level imports included. Prints one
line per problem, naming the file and line; exit status 1 when there is one.

The target layers, lowest first (DESIGN.md "Where the layout goes next"):
leaves, formats/ and batch/, kernels/, model/, the tokenizer with the sampling and
structured rules, engine/, the library API, serve/ and bench/, the command line.

Usage: python tools/import_layers.py [ROOT]   (ROOT: the repository, default ..)
"""
from __future__ import annotations

import ast
import os
import sys

PACKAGE = "tinypaged"
# (rank, module names or package prefixes): a module takes the first entry that names it
LAYERS = [
    (0, ["config", "speculative_config", "checks", "interrupts", "outputs", "prompts", "jit_cache", "lora_request"]),
    (1, ["formats", "batch"]),
    (2, ["kernels"]),
    (3, ["model"]),
    (4, ["tokenizer", "chat_template", "template_budget", "structured", "sampling", "logprobs"]),
    (5, ["engine"]),
    (6, ["llm", "request_handle", "perplexity", "pull", "pull_parts", "rerank", "__init__"]),
    (7, ["serve", "bench"]),
    (8, ["cli", "__main__"]),
]


def rank_of(module: str) -> int | None:
    """module: dotted, without the package ("kernels.cpu.linear")."""
    for rank, names in LAYERS:
        for name in names:
            if module == name or module.startswith(name + "."):
                return rank
    return None


def modules(root: str) -> dict[str, str]:
    """Dotted module name (without the package) -> file path."""
    found = {}
    base = os.path.join(root, PACKAGE)
    for folder, _, files in os.walk(base):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                dotted = os.path.relpath(path, base)[:-3].replace(os.sep, ".")
                found[dotted.removesuffix(".__init__") if dotted != "__init__" else dotted] = path
    return found


def imports(path: str, module: str, known: dict[str, str]) -> list[tuple[str, int]]:
    """(imported module, line) for each import of ours in the file."""
    with open(path) as f:
        tree = ast.parse(f.read(), path)
    is_package = path.endswith("__init__.py")
    here = module.split(".") if is_package else module.split(".")[:-1]
    if module == "__init__":
        here = []
    found = []
    for node in ast.walk(tree):
        targets = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[:len(here) - (node.level - 1)] if node.level > 1 else here
                prefix = ".".join(base + ([node.module] if node.module else []))
            else:
                prefix = node.module or ""
                if not (prefix == PACKAGE or prefix.startswith(PACKAGE + ".")):
                    continue
                prefix = prefix[len(PACKAGE) + 1:]
            targets = [f"{prefix}.{a.name}" if prefix else a.name for a in node.names]
            targets = [t if t in known else prefix for t in targets]
        for target in targets:
            if target.startswith(PACKAGE + "."):
                target = target[len(PACKAGE) + 1:]
            if target in known and target != module and (target, node.lineno) not in found:
                found.append((target, node.lineno))
    return found


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    sys.setrecursionlimit(10_000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def problems(root: str) -> list[str]:
    known = modules(root)
    graph: dict[str, set[str]] = {m: set() for m in known}
    lines = []
    for module, path in sorted(known.items()):
        rank = rank_of(module)
        if rank is None:
            lines.append(f"{os.path.relpath(path, root)}: {module} is in no layer")
            continue
        for target, line in imports(path, module, known):
            graph[module].add(target)
            other = rank_of(target)
            if other is not None and other > rank and not module.startswith("__init__"):
                lines.append(f"{os.path.relpath(path, root)}:{line}: {module} (layer {rank}) "
                             f"imports {target} (layer {other}), a layer above")
    # (a package's __init__ importing its own modules is no cycle of the design's)
    for component in cycles({m: {t for t in ts if not (t.startswith(m + ".") or
                                                        m.startswith(t + ".") and
                                                        known[t].endswith("__init__.py"))}
                             for m, ts in graph.items()}):
        lines.append(f"import cycle: {' <-> '.join(component)}")
    return lines


def main() -> None:
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..")
    found = problems(os.path.abspath(root))
    for line in found:
        print(line)
    print(f"{len(found)} problems")
    sys.exit(1 if found else 0)


if __name__ == "__main__":
    main()
