"""CPU matrix products with packed weights (model/packed.py): Q8_0, Q4_0, Q4_1.

Decode (a few rows of x) is bound by the bytes of weights read. Each weight row is
widened once into an L1-resident float32 buffer (scale * q, + min), then dotted
with every row of x, as the float16 GEMV does (linear.py): one pass over the
packed bytes (1.06 bytes per weight for Q8_0, 0.56-0.63 for Q4_x, against 2 for
float16), float32 accumulation, no rounding of x. Loops run flat over the row
(the block's scale looked up as k >> 5), which LLVM vectorizes for Q8_0; loops
nested per 32-weight block did not. Quantizing x to int8 for an integer inner
loop (llama.cpp's way) was tried first: numba's LLVM did not vectorize it either.

Prefill and larger batches are bound by arithmetic: rows of W are dequantized a
tile at a time and BLAS multiplies each tile (tiles.py).
"""
import numpy as np
from numba import float32, njit, prange

from ...model.ggml_quant import Q4_1, Q8_0
from .common import N_CHUNKS, f16_bits_to_f32
from .tiles import tiled_matmul
from .widen import EIGHT, kind_arguments, widen_rows


@njit(parallel=True, fastmath=True, cache=True)
def _gemv_q8_0(x, quants, scales, out):
    """out (M, N) = x (M, K) @ W.T for Q8_0 W, small M. Threads split W's rows into
    N_CHUNKS ranges; each row is widened once into an L1-resident buffer (one flat
    loop, the block's scale looked up as k >> 5), then dotted with every row of x.
    Traffic: the packed bytes once."""
    n_rows, width = x.shape
    n_out = quants.shape[0]
    per_chunk = -(-n_out // N_CHUNKS)
    for c in prange(N_CHUNKS):
        row = np.empty(width, dtype=np.float32)
        for n in range(c * per_chunk, min(n_out, (c + 1) * per_chunk)):
            for k in range(width):
                row[k] = f16_bits_to_f32(scales[n, k >> 5]) * float32(quants[n, k])
            for m in range(n_rows):
                acc = float32(0.0)
                for k in range(width):
                    acc += row[k] * x[m, k]
                out[m, n] = acc


@njit(parallel=True, fastmath=True, cache=True)
def _gemv_q4(x, quants, scales, mins, with_min, out):
    """_gemv_q8_0 for Q4_0 (weight = scale * (q - 8)) and Q4_1 (with_min: scale * q +
    min; for Q4_0, mins is any array of the scales' shape, never read). Byte p of a
    row holds weight p (low nibble) and weight K/2 + p (high); each half is widened
    by its own loop into its own buffer.

    Vectorizing this took care: the upper half's first block (`upper`) is computed
    inside the row loop. Computed once before the parallel loop, it reaches the loop
    body as a value numba passes in, and LLVM then leaves the widening loops scalar
    (4x slower)."""
    n_rows, width = x.shape
    n_out = quants.shape[0]
    per_chunk = -(-n_out // N_CHUNKS)
    for c in prange(N_CHUNKS):
        half = width >> 1
        low = np.empty(half, dtype=np.float32)
        high = np.empty(half, dtype=np.float32)
        for n in range(c * per_chunk, min(n_out, (c + 1) * per_chunk)):
            upper = half >> 5  # the block holding weight K/2 (K is a multiple of 64)
            if with_min:
                for k in range(half):
                    low[k] = (f16_bits_to_f32(scales[n, k >> 5]) * float32(quants[n, k] & np.uint8(15))
                              + f16_bits_to_f32(mins[n, k >> 5]))
                for k in range(half):
                    b = upper + (k >> 5)
                    high[k] = (f16_bits_to_f32(scales[n, b]) * float32(quants[n, k] >> np.uint8(4))
                               + f16_bits_to_f32(mins[n, b]))
            else:
                for k in range(half):
                    low[k] = f16_bits_to_f32(scales[n, k >> 5]) * (
                        float32(quants[n, k] & np.uint8(15)) - EIGHT)
                for k in range(half):
                    high[k] = f16_bits_to_f32(scales[n, upper + (k >> 5)]) * (
                        float32(quants[n, k] >> np.uint8(4)) - EIGHT)
            for m in range(n_rows):
                acc = float32(0.0)
                for k in range(half):
                    acc += low[k] * x[m, k]
                for k in range(half):
                    acc += high[k] * x[m, half + k]
                out[m, n] = acc


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


def _mins(weight) -> np.ndarray:
    return weight.mins if weight.mins is not None else weight.scales  # (unread for Q8_0, Q4_0)


def gemv_packed(x: np.ndarray, weight) -> np.ndarray:
    """x (M, K) float32, small M, @ packed weight (N, K).T -> (M, N)."""
    out = np.empty((len(x), weight.shape[0]), dtype=np.float32)
    if weight.ggml_type == Q8_0:
        _gemv_q8_0(x, weight.quants, weight.scales, out)
    else:
        _gemv_q4(x, weight.quants, weight.scales, _mins(weight), weight.ggml_type == Q4_1, out)
    return out


def matmul_packed(x: np.ndarray, weight) -> np.ndarray:
    """x (M, K) float32 @ packed weight (N, K).T -> (M, N), a widened tile at a time."""
    mins = _mins(weight)
    return tiled_matmul(x, weight.shape[0], lambda first, tile: dequantize_rows(
        weight.ggml_type, weight.quants, weight.scales, mins, first, tile))
