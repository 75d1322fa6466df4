"""A small-batch GEMM over float weights held narrow: float16 or bfloat16 bits (or
float32).

Batched decode (M up to ~64 rows of x) is bound by arithmetic, not by the weights'
bytes, and BLAS wants float32 weights: 4 bytes each, or a widened tile per call.
Here each thread takes a range of W's rows four at a time, widens the four into
an L1-resident (4, K) float32 buffer, and multiplies them with x two rows at a
time: eight float32 accumulators, six loads per eight multiply-adds, which LLVM
vectorizes (AVX-512 here). Each weight is read and widened once per call.

Measured (M = 32, 2 cores, bench/NOTES.md): level with BLAS on float32 for
SmolLM2's 576-wide layer matrices, 2x faster for its 49152 x 576 lm_head, where
BLAS's float32 copy no longer fits the caches.
The forms and their widening: widen.py. (Packed weights: lanes_product.py.)
"""
import numpy as np
from numba import float32, prange

from ...jit_cache import cached_njit
from .common import N_CHUNKS
from .widen import widen_rows

GROUP = 4  # weight rows widened together


@cached_njit(parallel=True, fastmath=True)
def _gemm(x, data, out):
    """out (M, N) = x (M, K) float32 @ W.T, W (N, K) of the given kind, N >= GROUP.

    The last group of rows is shifted back to end at row N - 1 (it recomputes a
    few outputs rather than branching on a remainder)."""
    n_rows, width = x.shape
    n_out = out.shape[1]
    n_groups = -(-n_out // GROUP)
    for c in prange(N_CHUNKS):
        w = np.empty((GROUP, width), dtype=np.float32)
        for g in range(c * n_groups // N_CHUNKS, (c + 1) * n_groups // N_CHUNKS):  # (even shares)
            n0 = min(g * GROUP, n_out - GROUP)
            widen_rows(data, n0, w)
            for m in range(0, n_rows - 1, 2):  # two rows of x at a time
                a0 = float32(0.0); a1 = float32(0.0); a2 = float32(0.0); a3 = float32(0.0)
                b0 = float32(0.0); b1 = float32(0.0); b2 = float32(0.0); b3 = float32(0.0)
                for k in range(width):
                    xa = x[m, k]
                    xb = x[m + 1, k]
                    w0 = w[0, k]; w1 = w[1, k]; w2 = w[2, k]; w3 = w[3, k]
                    a0 += w0 * xa; a1 += w1 * xa; a2 += w2 * xa; a3 += w3 * xa
                    b0 += w0 * xb; b1 += w1 * xb; b2 += w2 * xb; b3 += w3 * xb
                out[m, n0] = a0; out[m, n0 + 1] = a1; out[m, n0 + 2] = a2; out[m, n0 + 3] = a3
                out[m + 1, n0] = b0; out[m + 1, n0 + 1] = b1
                out[m + 1, n0 + 2] = b2; out[m + 1, n0 + 3] = b3
            if n_rows % 2 == 1:  # the odd last row of x
                m = n_rows - 1
                a0 = float32(0.0); a1 = float32(0.0); a2 = float32(0.0); a3 = float32(0.0)
                for k in range(width):
                    xa = x[m, k]
                    a0 += w[0, k] * xa; a1 += w[1, k] * xa; a2 += w[2, k] * xa; a3 += w[3, k] * xa
                out[m, n0] = a0; out[m, n0 + 1] = a1; out[m, n0 + 2] = a2; out[m, n0 + 3] = a3


def gemm_narrow(x: np.ndarray, data: np.ndarray, out: np.ndarray) -> None:
    """out (M, N) = x (M, K) float32 @ W.T for W (N >= GROUP rows) held in data: float32,
    float16 bits (uint16) or bfloat16 bits (int16)."""
    _gemm(x, data, out)
