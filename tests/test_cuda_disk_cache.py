"""CUDA kernels cached on disk (kernels/cuda/disk_cache.py): keyed so that no two
kernels share an entry and no edit leaves a stale one. Compiling needs a GPU, so
here the keys and stamps are read in a process without the simulator (the
kernels' dispatchers, not their code); gpu_check's second run on a GPU shows the
cache loading (bench/NOTES.md)."""
import os
import subprocess
import sys

from conftest import ROOT

from tinypaged.kernels.cuda.disk_cache import closure_key

READ_KEYS = """
from numba import types
from tinypaged.kernels.cuda import elementwise, kquant_matmul
from tinypaged.kernels.cuda.disk_cache import _stamped_cache_class
from tinypaged.jit_cache import sources_digest

class Codegen:  # what a device would answer: the runtime's version and the chip's
    def magic_tuple(self):
        return ((13, 0), (9, 0))

cls = _stamped_cache_class()
assert cls is not None
sig = (types.float32[:, :],)
keys = {kind: str(family[0]._cache._index_key(sig, Codegen()))
        for kind, family in kquant_matmul.DECODE_KERNELS.items()}
assert all(type(family[0]._cache) is cls for family in kquant_matmul.DECODE_KERNELS.values())
print("distinct", len(set(keys.values())), len(keys))
stamp = elementwise.add._cache._impl.locator.get_source_stamp()
print("digest", stamp[1] == sources_digest("tinypaged.kernels.cuda.elementwise"))
"""


def test_each_quant_kinds_kernel_has_its_own_cache_key_and_a_sources_stamp():
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "0"}
    result = subprocess.run([sys.executable, "-c", READ_KEYS], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "distinct 5 5" in result.stdout and "digest True" in result.stdout


def test_a_closure_key_names_constants_and_device_functions_recursively():
    def make(kind):
        def inner():
            return kind

        class Dispatcher:  # what numba's dispatchers carry: the Python function
            py_func = inner

        dispatcher = Dispatcher()

        def kernel():
            return dispatcher, kind
        return kernel
    four, six = closure_key(make(4)), closure_key(make(6))
    assert four != six and "inner(4)" in four and four.endswith(";4")
