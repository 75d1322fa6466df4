"""`cached_kernel`: cuda.jit kernels cached on disk (numba-cuda's cache), stale when
any source compiled into them changes, as tinypaged/jit_cache.py does for njit.

numba-cuda checks a cached kernel against its own file and keys it by a pickle of
its closure. Here the stamp also holds the digest of the package modules the
kernel's file imports (device functions are inlined from them), and a closure is
keyed by what it holds, read without pickling: the constants, and for a device
function its module, name and own closure (a factory's kernels, one per quant
kind, share a name and differ only there). A second process, gpu_check's test
run included, loads the kernels instead of compiling them again.
"""
from __future__ import annotations

import hashlib
import sys

from numba import config, cuda

from ...jit_cache import StampedLocator


def cached_kernel(launch_bounds=None):
    """Decorator: cuda.jit(launch_bounds=...) with the stamped on-disk cache. The
    simulator's jit takes neither (and compiles nothing to cache)."""
    if config.ENABLE_CUDASIM:
        return cuda.jit

    def decorate(py_func):
        dispatcher = cuda.jit(launch_bounds=launch_bounds)(py_func)
        cache_class = _stamped_cache_class()
        if cache_class is not None:
            dispatcher._cache = cache_class(py_func)  # what enable_caching() sets, stamped
        return dispatcher
    return decorate


def closure_key(py_func, depth: int = 0) -> str:
    """What a function's closure holds, as text: constants by repr, device functions
    by module, name and their own closure."""
    cells = py_func.__closure__ or ()
    parts = []
    for cell in cells:
        value = cell.cell_contents
        inner = getattr(value, "py_func", None)
        if inner is not None and depth < 8:
            parts.append(f"{inner.__module__}.{inner.__qualname__}"
                         f"({closure_key(inner, depth + 1)})")
        elif isinstance(value, (int, float, bool, str, bytes, tuple, type(None))):
            parts.append(repr(value))
        else:
            parts.append(f"{type(value).__module__}.{type(value).__qualname__}")
    return ";".join(parts)


_CACHE_CLASS = []


def _stamped_cache_class():
    """numba-cuda's CUDACache with the stamped locator and the closure key; None where
    this numba-cuda lays its cache out otherwise (then kernels are not cached)."""
    if _CACHE_CLASS:
        return _CACHE_CLASS[0]
    try:
        import numba_cuda
        from numba.cuda.dispatcher import CUDACache, CUDACacheImpl
    except ImportError:
        _CACHE_CLASS.append(None)
        return None

    class StampedImpl(CUDACacheImpl):
        def __init__(self, py_func):
            super().__init__(py_func)
            module = sys.modules[py_func.__module__]
            spec = getattr(module, "__spec__", None)
            self._locator = StampedLocator(self._locator, spec.name if spec else module.__name__)

    class StampedCache(CUDACache):
        _impl_class = StampedImpl

        def _index_key(self, sig, codegen):
            code = hashlib.sha256(self._py_func.__code__.co_code).hexdigest()
            closure = hashlib.sha256(closure_key(self._py_func).encode()).hexdigest()
            key = (sig, codegen.magic_tuple(), numba_cuda.__version__, (code, closure))
            launch_config = getattr(self, "_launch_config_key", None)
            return key if launch_config is None else key + (("launch_config", launch_config),)

    _CACHE_CLASS.append(StampedCache)
    return StampedCache
