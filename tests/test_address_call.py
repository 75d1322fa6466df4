"""address_call: a kernel called at its address from a parallel loop, and never with
arguments of other types than it was compiled for."""
import numpy as np
from numba import prange, typeof, types

from tinypaged import jit_cache
from tinypaged.jit_cache import cached_njit
from tinypaged.kernels.cpu.address_call import call_entry, compiled_entry


@cached_njit(fastmath=True)
def _scaled_row(r, x, scale, out):
    """out[r] = scale * x[r] ** 2 + r (a row a call)."""
    for j in range(x.shape[1]):
        out[r, j] = scale * x[r, j] * x[r, j] + r


@cached_njit(parallel=True)
def _rows_by_address(entry, x, scale, out):
    done = np.empty(len(x), np.bool_)
    for r in prange(len(x)):
        done[r] = call_entry(entry, (np.int64(r), x, scale, out))
    return done.all()


def test_a_parallel_loop_calls_a_kernel_at_its_address():
    """Every row computed by the kernel the loop calls at its address, on fresh random
    values; the kernel is listed as called (preload loads it)."""
    rng = np.random.default_rng()
    x, scale = rng.standard_normal((37, 19)).astype(np.float32), np.float32(rng.uniform(0.5, 2))
    out = np.full_like(x, np.nan)
    entry = compiled_entry(_scaled_row, (types.int64, typeof(x), types.float32, typeof(out)))
    assert _rows_by_address(entry, x, scale, out)
    np.testing.assert_allclose(out, scale * x * x + np.arange(37, dtype=np.float32)[:, None], rtol=1e-6)
    assert any(key.endswith(":_scaled_row") for key in jit_cache.called_signatures())


def test_an_entry_for_other_types_is_not_called():
    """An entry compiled for float64 rows, or for a strided view, is refused by a loop
    that passes float32 C-contiguous arrays: False, and nothing written."""
    x = np.ones((5, 4), np.float32)
    wide = np.ones((5, 8), np.float32)[:, ::2]
    for other in ((types.int64, typeof(x.astype(np.float64)), types.float32, typeof(x.astype(np.float64))),
                  (types.int64, typeof(wide), types.float32, typeof(x))):
        out = np.zeros_like(x)
        assert not _rows_by_address(compiled_entry(_scaled_row, other), x, np.float32(2), out)
        assert not out.any()
