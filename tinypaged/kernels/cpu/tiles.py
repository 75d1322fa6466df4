"""x @ W.T for a weight matrix kept narrower than float32 (float16 or bfloat16 bits):
rows of W are widened a tile at a time into a reused float32 buffer (1 MiB, so it
stays in cache) and BLAS multiplies each tile.

The widening kernels are written as a parallel region of one chunk, and run here
with numba on one thread: inside such a region LLVM vectorizes their loops, which
it does not in plain njit code (the arrays might alias), and with one thread
numba's pool does not fight OpenBLAS's threads between tiles (milliseconds per
switch on two cores).
"""
from typing import Callable

import numba
import numpy as np
from numba import prange

from ...jit_cache import cached_njit
from .widen import widen_rows

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


@cached_njit(parallel=True)
def _widen_tile(data, first, out):
    """A parallel region of one chunk, run by tiled_matmul with numba on one thread:
    inside such a region LLVM vectorizes the widening loops (3.7 ms for a 49152 x 576
    matrix, against 64 ms as plain njit code)."""
    for _ in prange(1):
        widen_rows(data, first, out)


def widen_tile(data: np.ndarray, first: int, out: np.ndarray) -> None:
    """out (r, K) float32 = rows first .. first + r - 1 of the matrix held in data
    (widen.py's forms), exactly."""
    _widen_tile(data, first, out)
