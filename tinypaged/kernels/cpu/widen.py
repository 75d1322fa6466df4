"""The widening of a float matrix held narrower than float32 (LinearWeight: float16
or bfloat16 bits) to float32 rows, written once: the GEMM (gemm.py) widens four
rows at a time into L1, the BLAS tiles (tiles.py) a tile at a time.

Weight (n, k), by the dtype it is held in: float32 itself; uint16 float16 bits;
int16 bfloat16 bits (int16 only to tell the two apart). Widening is exact.
Packed (quantized) weights are never widened: their products take integer dot
products (lanes_product.py).
"""
from numba import types
from numba.extending import overload

from .common import bf16_bits_to_f32, f16_bits_to_f32


def widen_rows(data, first, w):
    """w (r, K) float32 = rows first .. first + r - 1 of the matrix held in data.
    Compiled per dtype (below): one kernel per form, each with its own vectorized
    loop (a runtime branch on the form left loops scalar, 2-4x slower)."""
    raise NotImplementedError("numba-only: see the overload below")


@overload(widen_rows, inline="always")
def _widen_rows_by_type(data, first, w):
    if data.dtype == types.float32:
        def widen(data, first, w):
            for r in range(w.shape[0]):
                for k in range(w.shape[1]):
                    w[r, k] = data[first + r, k]
    elif data.dtype == types.int16:  # bfloat16 bits
        def widen(data, first, w):
            for r in range(w.shape[0]):
                for k in range(w.shape[1]):
                    w[r, k] = bf16_bits_to_f32(data[first + r, k])
    else:  # float16 bits (uint16)
        def widen(data, first, w):
            for r in range(w.shape[0]):
                for k in range(w.shape[1]):
                    w[r, k] = f16_bits_to_f32(data[first + r, k])
    return widen
