"""The CUDA test files run on a GPU image that holds numpy, numba, numba-cuda, pytest
and the core's own dependencies, and nothing else of ours: no `gguf` (the reference
dequantizer), no serving or structured-output packages, no hypothesis. Here they are
made unimportable, and the CUDA files must still collect, and the packed-weight
test that once reached `gguf` through another test file must still pass."""
import os
import re
import subprocess
import sys

from conftest import ROOT
from cuda_test_files import LEFT_OFF_THE_CARD, ON_THE_GPU_IMAGE

ABSENT_ON_THE_GPU_IMAGE = ("gguf", "hypothesis", "fastapi", "uvicorn", "starlette", "openai",
                           "llguidance", "httpx", "torch", "transformers")
CUDA_TEST_FILES = (*ON_THE_GPU_IMAGE, "test_cuda_resources.py")

RUN_WITHOUT = """
import sys
import pytest
for name in {absent!r}:
    sys.modules[name] = None  # `import name` now raises ImportError
sys.exit(pytest.main({args!r}))
"""


def _pytest_without_extras(*args: str) -> subprocess.CompletedProcess:
    script = RUN_WITHOUT.format(absent=ABSENT_ON_THE_GPU_IMAGE, args=["-q", "-p", "no:cacheprovider",
                                                                     *args])
    # (no plugins from entry points: hypothesis's own would import what is blocked)
    env = {**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    return subprocess.run([sys.executable, "-c", script], cwd=ROOT / "tests", capture_output=True,
                          text=True, timeout=600, env=env)


def test_the_cuda_test_files_collect_without_the_extras():
    result = _pytest_without_extras("--collect-only", *CUDA_TEST_FILES)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    summary = result.stdout.strip().splitlines()[-1]
    assert re.fullmatch(r"(\d+) tests collected in .*", summary), summary  # (no "errors")
    assert int(summary.split()[0]) > 40  # every file's tests, not an empty collection


def test_the_packed_cuda_tests_pass_without_gguf():
    """One kind of each way the test makes its blocks (_packed_matrices: quantized,
    random Q5 blocks, random K-quant blocks); the main run holds the rest."""
    result = _pytest_without_extras(
        "test_cuda_kernels.py::test_packed_weights_go_up_packed_and_their_products_take_the_rounded_x",
        "-k", "Q8_0 or Q5_0 or Q4_K")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert "3 passed" in result.stdout


def test_every_file_with_cuda_tests_runs_on_the_card_or_says_why_not():
    """A new file's cuda tests are not left off the card's run without a word."""
    marker = re.compile(r"^@pytest\.mark\.cuda\b|^pytestmark = \[?pytest\.mark\.cuda|marks=pytest\.mark\.cuda",
                        re.MULTILINE)
    marked = {path.name for path in (ROOT / "tests").glob("test_*.py") if marker.search(path.read_text())}
    assert marked == set(ON_THE_GPU_IMAGE) | set(LEFT_OFF_THE_CARD)
