"""tools/import_layers.py, the layering check of DESIGN.md, on a made-up package: it
finds an import of a layer above (at the top of a file or inside a function), and
a cycle closed inside a function; a clean tree gives no problem."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tools"))
import import_layers  # noqa: E402


def write(root, files: dict[str, str]) -> str:
    for name, text in files.items():
        path = os.path.join(root, "tinypaged", name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(text)
    return str(root)


CLEAN = {
    "__init__.py": "from .llm import LLM\n",
    "config.py": "X = 1\n",
    "llm.py": "from .engine.loop import Loop\nfrom . import config\nLLM = Loop\n",
    "engine/__init__.py": "",
    "engine/loop.py": "from ..kernels import ops\nfrom ..model.llama import run\nLoop = run\n",
    "kernels/__init__.py": "",
    "kernels/ops.py": "from ..batch.meta import Meta\nfrom tinypaged.config import X\n",
    "batch/__init__.py": "",
    "batch/meta.py": "Meta = 1\n",
    "model/__init__.py": "",
    "model/llama.py": "from ..kernels.ops import Meta\ndef run():\n    return Meta\n",
}


def test_a_clean_tree_has_no_problem(tmp_path):
    assert import_layers.problems(write(tmp_path, CLEAN)) == []


def test_an_import_of_a_layer_above_is_named_with_its_file_and_line(tmp_path):
    files = dict(CLEAN)
    files["kernels/ops.py"] += "def late():\n    from ..engine import loop\n    return loop\n"
    files["batch/meta.py"] = "import tinypaged.model.llama\nMeta = 1\n"
    found = import_layers.problems(write(tmp_path, files))
    assert os.path.join("tinypaged", "kernels", "ops.py") + ":4: kernels.ops (layer 2) imports " \
        "engine.loop (layer 5), a layer above" in found
    assert any(line.startswith(os.path.join("tinypaged", "batch", "meta.py") + ":1: ")
               and "model.llama (layer 3)" in line for line in found)


def test_a_cycle_closed_inside_a_function_is_found(tmp_path):
    files = dict(CLEAN)
    files["model/weights.py"] = "from .packed import P\nW = 1\n"
    files["model/packed.py"] = "P = 1\ndef load():\n    from .weights import W\n    return W\n"
    found = import_layers.problems(write(tmp_path, files))
    assert found == ["import cycle: model.packed <-> model.weights"]


def test_a_module_in_no_layer_is_named(tmp_path):
    files = dict(CLEAN, **{"stray.py": "Y = 2\n"})
    assert import_layers.problems(write(tmp_path, files)) == [
        os.path.join("tinypaged", "stray.py") + ": stray is in no layer"]


def test_tinypaged_itself_keeps_the_layers_and_has_no_cycle():
    """DESIGN.md's rules on the real tree: each problem named with its file and line."""
    root = os.path.join(os.path.dirname(__file__), "..")
    assert import_layers.problems(os.path.abspath(root)) == []
