"""CPU matrix products with packed weights (formats/packed.py): Q8_0, Q4_0, Q4_1, Q5_0,
Q5_1 and the K-quants Q4_K, Q5_K, Q6_K.

A packed weight multiplies x rounded to int8 per 32-block (activations.py), as
llama.cpp's CPU path does. Each block's product is then an exact integer dot
product, scaled by the weight block's and x block's scales in one fixed float32
sequence (packed_terms.py), so every kernel gives a row of x the same bits: the
result of a request never depends on the batch it ran in.

Decode (M <= common.PACKED_GEMV_MAX_ROWS rows of x) is bound by the bytes of weights
read: the GEMV here streams each packed row once (1.06 bytes per weight for Q8_0, 0.56-0.63
for Q4_x, 0.69-0.75 for Q5_x, against 2 for float16) and takes each block's dot product in integers
(int8_dot.py: vpdpbusd here), nothing widened (widening a row to float32 first is
arithmetic-bound at batch 1: bench/NOTES.md).

More rows (batched decode, prefill) go to packed_gemm.py, which lays out 16 weight
rows at a time for vector lanes and is as fast as BLAS on float32 or faster.
"""
import numpy as np
from numba import float32, prange, types
from numba.extending import overload

from ...jit_cache import cached_njit
from .activations import quantize_activations
from .common import N_CHUNKS, PACKED_GEMV_MAX_ROWS, fma32
from .int8_dot import (dot32_biased, dot32_high, dot32_high5, dot32_low, dot32_low5, dot32_q6_high,
                       dot32_q6_low)
from .out_arrays import output_array
from .packed_gemm import LANES, gemm_packed
from .packed_terms import block_term, dot_offset, flat_bits, is_q6_k, min_of, scale_of

TILE = 8  # W rows whose dots, then terms, then sums a thread takes together


def _row_dots(quants, scales, weights, bits, n, xs, x_at, width, dots, at):
    """dots[at + b] = the integer dot of row n's block b with x's (from xs[x_at]),
    exact (int8_dot.py). bits: Q5_x's fifth bits or Q6_K's top bits, flat, or None."""
    raise NotImplementedError("numba-only: see the overload below")


@overload(_row_dots, inline="always")
def _row_dots_by_kind(quants, scales, weights, bits, n, xs, x_at, width, dots, at):
    if is_q6_k(scales):  # Q6_K: nibbles as Q4_x, 2 top bits a weight, int8 scales per 16
        def row(quants, scales, weights, bits, n, xs, x_at, width, dots, at):
            half = width >> 1
            upper = half >> 5
            row_bits = n * (width >> 2)
            for b in range(upper):
                dots[at + b] = dot32_q6_low(weights, n * half + b * 32, bits, row_bits + 8 * b,
                                            np.int32(scales[n, 2 * b]), np.int32(scales[n, 2 * b + 1]),
                                            xs, x_at + b * 32)
            for b in range(upper):
                c = upper + b
                dots[at + c] = dot32_q6_high(weights, n * half + b * 32, bits, row_bits + 8 * c,
                                             np.int32(scales[n, 2 * c]), np.int32(scales[n, 2 * c + 1]),
                                             xs, x_at + half + b * 32)
    elif quants.dtype == types.int8:  # Q8_0: a row's bytes in order, read xor 128
        def row(quants, scales, weights, bits, n, xs, x_at, width, dots, at):
            for b in range(width >> 5):
                dots[at + b] = dot32_biased(weights, n * width + b * 32, xs, x_at + b * 32)
    elif isinstance(bits, types.NoneType):  # Q4_x: byte p holds weight p (low nibble)
        def row(quants, scales, weights, bits, n, xs, x_at, width, dots, at):  # and K/2 + p (high)
            half = width >> 1
            upper = half >> 5
            for b in range(upper):
                dots[at + b] = dot32_low(weights, n * half + b * 32, xs, x_at + b * 32)
            for b in range(upper):
                dots[at + upper + b] = dot32_high(weights, n * half + b * 32, xs, x_at + half + b * 32)
    else:  # Q5_x: Q4_x's nibbles with the fifth bits (4 bytes a block, column order) added
        def row(quants, scales, weights, bits, n, xs, x_at, width, dots, at):
            half = width >> 1
            upper = half >> 5
            row_bits = n * (width >> 3)
            for b in range(upper):
                dots[at + b] = dot32_low5(weights, n * half + b * 32, bits, row_bits + 4 * b,
                                          xs, x_at + b * 32)
            for b in range(upper):
                dots[at + upper + b] = dot32_high5(weights, n * half + b * 32, bits,
                                                   row_bits + 4 * (upper + b), xs, x_at + half + b * 32)
    return row


@cached_njit(parallel=True)
def _gemv(x, quants, scales, mins, supers, highs, out):
    """out (M, N) = round_activations(x) (M, K) @ W.T for packed W, small M. x is
    quantized to int8 blocks (activations.py); threads split W's rows into N_CHUNKS
    ranges and take them TILE at a time: first every block's integer dot (int8_dot.py),
    then every block's float term (a loop LLVM vectorises), then each row's sum of
    terms in block order (packed_terms.py). Each sum is a serial chain of fused adds
    (4 cycles each); TILE rows give the CPU TILE chains to run side by side, where
    row by row the chains were the GEMV's bound (bench/NOTES.md).
    Traffic: the packed bytes once (0.56-1.06 bytes a weight), x from L1. mins None:
    Q8_0 (int8 quants), Q4_0, Q5_0 and Q6_K; supers given: K-quants; highs given: Q5_x,
    Q5_K and Q6_K."""
    xq, dx, qsum = quantize_activations(x, len(x))
    n_rows, width = x.shape
    n_out = quants.shape[0]
    n_blocks = width >> 5
    weights = quants.reshape(-1)
    xs = xq.reshape(-1)
    bits = flat_bits(highs)
    offset = dot_offset(quants, scales, mins, highs)
    per_chunk = -(-n_out // N_CHUNKS)
    for c in prange(N_CHUNKS):
        dots = np.zeros(TILE * n_blocks, dtype=np.int32)
        terms = np.zeros(TILE * n_blocks, dtype=np.float32)
        end = min(n_out, (c + 1) * per_chunk)
        for n0 in range(c * per_chunk, end, TILE):
            rows = min(TILE, end - n0)
            for m in range(n_rows):
                for r in range(rows):
                    _row_dots(quants, scales, weights, bits, n0 + r, xs, m * width, width, dots,
                              r * n_blocks)
                for r in range(rows):
                    for b in range(n_blocks):
                        dot = dots[r * n_blocks + b] - offset * qsum[m, b]
                        terms[r * n_blocks + b] = block_term(
                            scale_of(scales, supers, n0 + r, b), mins,
                            min_of(mins, supers, n0 + r, b), dot, qsum[m, b])
                for r in range(rows):
                    acc = float32(0.0)
                    for b in range(n_blocks):
                        acc = fma32(dx[m, b], terms[r * n_blocks + b], acc)
                    out[m, n0 + r] = acc


def gemv_packed(x: np.ndarray, weight) -> np.ndarray:
    """round_activations(x) (M, K), small M, @ packed weight (N, K).T -> (M, N), in
    integer block dot products."""
    out = output_array(len(x), weight.shape[0])
    _gemv(x, weight.quants, weight.scales, weight.mins, weight.supers, weight.highs, out)
    return out


def packed_product(x: np.ndarray, weight) -> np.ndarray:
    """round_activations(x) (M, K) @ packed weight (N, K).T -> (M, N), any M: the GEMV
    for a few rows (or a matrix of under 16 rows), else packed_gemm. Both give the
    same bits for a row (packed_terms.py), so the choice never changes a result."""
    if len(x) <= PACKED_GEMV_MAX_ROWS or weight.shape[0] < LANES:
        return gemv_packed(x, weight)
    out = output_array(len(x), weight.shape[0])
    gemm_packed(x, weight.quants, weight.scales, weight.mins, out, supers=weight.supers,
                highs=weight.highs)
    return out
