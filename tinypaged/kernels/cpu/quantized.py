"""CPU matrix products with packed weights (model/packed.py): Q8_0, Q4_0, Q4_1, Q4_K.

A packed weight multiplies x rounded to int8 per 32-block (activations.py), as
llama.cpp's CPU path does. Each block's product is then an exact integer dot
product, scaled by the weight block's and x block's scales in one fixed float32
sequence (packed_terms.py), so every kernel gives a row of x the same bits: the
result of a request never depends on the batch it ran in.

Decode (M <= GEMV_MAX_ROWS rows of x) is bound by the bytes of weights read: the
GEMV here streams each packed row once (1.06 bytes per weight for Q8_0, 0.56-0.63
for Q4_x, against 2 for float16) and takes each block's dot product in integers
(int8_dot.py: vpdpbusd here), nothing widened: 2-2.7x faster than widening each
row to float32 first, which was arithmetic-bound at batch 1 (bench/NOTES.md).

More rows (batched decode, prefill) go to packed_gemm.py, which lays out 16 weight
rows at a time for vector lanes and is as fast as BLAS on float32 or faster.
"""
import numpy as np
from numba import float32, njit, prange

from ...model.ggml_quant import Q8_0
from .activations import quantize_activations
from .common import N_CHUNKS, f16_bits_to_f32
from .int8_dot import dot32_biased, dot32_high, dot32_low
from .packed_terms import block_term, min_of, nibble_offset, scale_of
from .packed_gemm import LANES, gemm_packed

GEMV_MAX_ROWS = 2  # rows of x up to which the GEMV beats laying out a group (packed_gemm)


@njit(parallel=True, cache=True)
def _gemv_q8_0(x, quants, scales, out):
    """out (M, N) = round_activations(x) (M, K) @ W.T for Q8_0 W, small M. x is
    quantized to int8 blocks first (activations.py); each block's product is then
    an integer dot product (int8_dot.py), scaled as packed_terms.py says. Threads
    split W's rows into N_CHUNKS ranges. Traffic: the packed bytes once (1.06 per
    weight), x from L1."""
    xq, dx, qsum = quantize_activations(x)
    n_rows, width = x.shape
    n_out, n_blocks = scales.shape
    weights = quants.reshape(-1)
    xs = xq.reshape(-1)
    per_chunk = -(-n_out // N_CHUNKS)
    for c in prange(N_CHUNKS):
        for n in range(c * per_chunk, min(n_out, (c + 1) * per_chunk)):
            for m in range(n_rows):
                acc = float32(0.0)
                for b in range(n_blocks):
                    dot = dot32_biased(weights, n * width + b * 32, xs, m * width + b * 32) \
                        - 128 * qsum[m, b]
                    acc = acc + block_term(f16_bits_to_f32(scales[n, b]), None, float32(0.0),
                                           dx[m, b], dot, qsum[m, b])
                out[m, n] = acc


@njit(parallel=True, cache=True)
def _gemv_q4(x, quants, scales, mins, supers, out):
    """_gemv_q8_0 for Q4_0 (mins None), Q4_1 and Q4_K (supers given). Byte p of a row
    holds weight p (low nibble, block p // 32) and weight K/2 + p (high nibble, block
    upper + p // 32): the low blocks, then the high ones, each 32 bytes read twice
    (from L1). The kinds differ in nibble_offset, scale_of, min_of and block_term,
    chosen at compile time: a runtime branch on the kind in this loop made it 2x
    slower."""
    xq, dx, qsum = quantize_activations(x)
    n_rows, width = x.shape
    n_out = quants.shape[0]
    half = width >> 1
    weights = quants.reshape(-1)
    xs = xq.reshape(-1)
    per_chunk = -(-n_out // N_CHUNKS)
    for c in prange(N_CHUNKS):
        for n in range(c * per_chunk, min(n_out, (c + 1) * per_chunk)):
            upper = half >> 5  # the block holding weight K/2 (K is a multiple of 64)
            for m in range(n_rows):
                acc = float32(0.0)
                for b in range(upper):
                    dot = dot32_low(weights, n * half + b * 32, xs, m * width + b * 32) \
                        - nibble_offset(mins) * qsum[m, b]
                    acc = acc + block_term(scale_of(scales, supers, n, b), mins,
                                           min_of(mins, supers, n, b), dx[m, b], dot, qsum[m, b])
                for b in range(upper, 2 * upper):
                    dot = dot32_high(weights, n * half + (b - upper) * 32, xs, m * width + b * 32) \
                        - nibble_offset(mins) * qsum[m, b]
                    acc = acc + block_term(scale_of(scales, supers, n, b), mins,
                                           min_of(mins, supers, n, b), dx[m, b], dot, qsum[m, b])
                out[m, n] = acc


def gemv_packed(x: np.ndarray, weight) -> np.ndarray:
    """round_activations(x) (M, K), small M, @ packed weight (N, K).T -> (M, N), in
    integer block dot products."""
    out = np.empty((len(x), weight.shape[0]), dtype=np.float32)
    if weight.ggml_type == Q8_0:
        _gemv_q8_0(x, weight.quants, weight.scales, out)
    else:
        _gemv_q4(x, weight.quants, weight.scales, weight.mins, weight.supers, out)
    return out


def packed_product(x: np.ndarray, weight) -> np.ndarray:
    """round_activations(x) (M, K) @ packed weight (N, K).T -> (M, N), any M: the GEMV
    for a few rows (or a matrix of under 16 rows), else packed_gemm. Both give the
    same bits for a row (packed_terms.py), so the choice never changes a result."""
    if len(x) <= GEMV_MAX_ROWS or weight.shape[0] < LANES:
        return gemv_packed(x, weight)
    out = np.empty((len(x), weight.shape[0]), dtype=np.float32)
    gemm_packed(x, weight.quants, weight.scales, weight.mins, out, supers=weight.supers)
    return out
