"""x @ W.T for a weight matrix kept narrower than float32 (float16 or bfloat16 bits;
packed blocks widen the same way): rows of W are widened a tile at a time into a
reused float32 buffer (1 MiB, so it stays in cache) and BLAS multiplies each tile.

The widening kernels are written as a parallel region of one chunk, and run here
with numba on one thread: inside such a region LLVM vectorizes their loops, which
it does not in plain njit code (the arrays might alias), and with one thread
numba's pool does not fight OpenBLAS's threads between tiles (milliseconds per
switch on two cores).
"""
from typing import Callable

import numba
import numpy as np
from numba import njit, prange

from .widen import kind_arguments, widen_rows

TILE_FLOATS = 1 << 18  # a widened tile holds this many float32: rows = this // K


def tiled_matmul(x: np.ndarray, n_out: int, widen: Callable[[int, np.ndarray], None]) -> np.ndarray:
    """x (M, K) float32 @ W.T -> (M, N); widen(first, tile) writes rows first .. first +
    len(tile) - 1 of W into tile as float32."""
    k = x.shape[1]
    rows = max(1, min(n_out, TILE_FLOATS // k))
    tile = np.empty((rows, k), dtype=np.float32)
    out = np.empty((len(x), n_out), dtype=np.float32)
    threads = numba.get_num_threads()
    numba.set_num_threads(1)  # this thread's numba calls only
    try:
        for first in range(0, n_out, rows):
            r = min(rows, n_out - first)
            widen(first, tile[:r])
            out[:, first:first + r] = x @ tile[:r].T
    finally:
        numba.set_num_threads(threads)
    return out


@njit(parallel=True, cache=True)
def _widen_tile(quants, scales, mins, first, out):
    """A parallel region of one chunk, run by tiles.tiled_matmul with numba on one
    thread: inside such a region LLVM vectorizes the widening loops (3.7 ms for a
    49152 x 576 Q8_0 matrix, against 64 ms as plain njit code)."""
    for _ in prange(1):
        widen_rows(quants, scales, mins, first, out)


def dequantize_rows(ggml_type: int, quants: np.ndarray, scales, mins, first: int,
                    out: np.ndarray) -> None:
    """out (r, K) float32 = rows first .. first + r - 1 of W, widened with the float32
    operations of PackedWeight.dequantize (equal bit for bit: no fastmath). Kinds
    F16 / BF16 widen float16 / bfloat16 bits held in quants (LinearWeight)."""
    _widen_tile(quants, *kind_arguments(ggml_type, scales, mins), first, out)
