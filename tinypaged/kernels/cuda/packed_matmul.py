"""CUDA products with packed weights, uploaded as the host holds them (formats/packed.py),
never widened whole. A matrix goes to the kernels as one tuple (device_weights.py):
    Q8_0, Q4_0, Q4_1   (quants, scales, mins, has_mins) to the GEMVs (Q4_x: and words,
                       the quants as int32 words, for the one-row kernels), (quants, scales,
                       mins, code) to the tiled product, code the kind's QuantKind.code
        quants  (N, K) int8 (Q8_0, read by the GEMVs as (N, K/4) int32 words);
                (N, K/2) uint8 (Q4_x: byte p holds weight p in its low nibble,
                weight p + K/2 in its high one)
        scales  (N, K/32) float16, mins (N, K/32) float16 (Q4_1; a placeholder otherwise)
    Q5_0, Q5_1, Q4_K, Q5_K, Q6_K   (quants, scales, mins, supers, highs, code):
        kquant_matmul.py
Weight (n, k) = scale * q (Q8_0), scale * (q - 8) (Q4_0), scale * q + min (Q4_1).
x comes rounded to int8 blocks already (elementwise.round_activations), as every
backend's packed products take it; products accumulate in float32.

- `gemv_q8_0`, `gemv_q4` (and their `_qkv` and `_gate_up_silu` forms: two or three
  matrices in one launch; Q8_0's `_paired`: two rows of one matrix a block, for
  lm_head): decode (M <= GEMV_MAX_ROWS), the float GEMVs' layout: a block per weight row, threads on 4 consecutive bytes of quants (Q8_0's read as
  one int32 word; a warp reads 128 consecutive bytes a step, coalesced), shfl_xor
  and shared-memory sums. Traffic: the packed row once (Q8_0: 34 bytes per 32 weights, Q4_0: 18,
  Q4_1: 20; float16: 64), x from cache. ONE_ROW_FAMILIES: the same four for one row of
  x (batch 1), in fewer registers.
- `TILED_PACKED`: prefill and large batches, tiled_matmul.tiled_kernels with each W
  tile dequantized as it is staged in shared memory.
"""
import math

import numpy as np
from numba import cuda, float32, int32

from ...formats.quant_kind import Q4_0, Q4_1, Q8_0, QK
from .bounded_jit import jit_bounded
from .device_function import device_function
from .matmul import GEMV_BOUNDS, GEMV_MAX_ROWS, GEMV_ROW_THREADS, GEMV_ROW_WARPS, VEC, _store_rows, block_sum_rows
from .tiled_matmul import tiled_kernels

Q4_WORDS = 4  # Q4_x's GEMV matrix tuple: the quants again as (N, K/8) int32 words (upload)


@device_function
def _weight(w, n, k, half):
    """Weight (n, k) as float32 of a Q8_0 / Q4_x matrix (half = K / 2, where Q4_x rows
    fold)."""
    quants, scales, mins, kind = w
    scale = float32(scales[n, k // QK])
    if kind == Q8_0:
        return scale * float32(quants[n, k])
    q = int32(quants[n, k]) & 15 if k < half else int32(quants[n, k - half]) >> 4
    if kind == Q4_0:
        return scale * float32(q - 8)
    return scale * float32(q) + float32(mins[n, k // QK])


@device_function
def _q8_0_row_dots(x, w, n, t, acc, w2, n2, acc2):
    """acc[m] = thread t's share of x[m] . W[n] (a block a row, its threads on
    consecutive words), on Q8_0 quants read as int32 words of 4 (one 4-byte load a
    thread; a warp reads 128 bytes); acc2[m] the same of W2[n2] where w2 is given
    (gate and up, or two rows of one matrix: both rows' loads in one pass; else None,
    and acc2 is acc)."""
    two = w2 is not None
    n_rows, width = x.shape
    for m in range(len(acc)):
        acc[m] = float32(0.0)
        acc2[m] = float32(0.0)
    for c in range(t, width // 4, GEMV_ROW_THREADS):  # word c holds weights 4c .. 4c + 3
        word = w[0][n, c]
        scale = float32(w[1][n, c // (QK // 4)])
        word2 = w2[0][n2, c] if two else word
        scale2 = float32(w2[1][n2, c // (QK // 4)]) if two else scale
        for v in range(4):
            wk = scale * float32(int32(word << (24 - 8 * v)) >> 24)  # byte v, sign-extended
            wk2 = scale2 * float32(int32(word2 << (24 - 8 * v)) >> 24)  # (little-endian)
            for m in range(len(acc)):
                if m < n_rows:
                    xk = x[m, 4 * c + v]
                    acc[m] += wk * xk
                    if two:
                        acc2[m] += wk2 * xk


@device_function
def nibble(byte, extra, v):
    """Column v's (of VEC) q from its nibble and extra bits (kquant_matmul's extra_bits:
    bit v is bit 4 of column v's q, bit 4 + v its bit 5; 0 for Q4_x)."""
    return byte | (((extra >> v) & 1) << 4) | (((extra >> (4 + v)) & 1) << 5)


def nibble_row_dots(scale_and_min, extra_bits, words: bool, words_at: int):
    """row_dots (decode_kernel_family's) of a kind whose bytes hold two nibbles, weights p
    and p + K/2 of a row (Q4_x, Q5_x, the K-quants), given its scale_and_min(w, n, c)
    (float32 scale and min of column c's block) and extra_bits(w, n, c) (q's bits
    above the nibble for columns c .. c + VEC - 1). A step's VEC bytes are read one at a
    time, or (words: the one-row kernels) as one int32 word, the matrix tuple's array
    words_at, with one row of x's step loaded before any sum where one matrix is read
    (beside a second's loads, that spilled 16-136 bytes)."""
    @device_function
    def row_dots(x, w, n, t, acc, w2, n2, acc2):
        """acc[m] = thread t's share of x[m] . W[n]: the block's threads walk the K/2 bytes
        of the row, VEC at a time; byte p gives weights p and p + K/2. acc2: the same of
        W2[n2] in the same pass where w2 is given (as _q8_0_row_dots)."""
        two = w2 is not None
        n_rows, width = x.shape
        half = width // 2
        hoist = words and not two
        xs_low = cuda.local.array(VEC, float32)  # (hoist: one row of x's step, in registers)
        xs_high = cuda.local.array(VEC, float32)
        for m in range(len(acc)):
            acc[m] = float32(0.0)
            acc2[m] = float32(0.0)
        for p0 in range(t * VEC, half, GEMV_ROW_THREADS * VEC):
            s_low, m_low = scale_and_min(w, n, p0)
            s_high, m_high = scale_and_min(w, n, p0 + half)
            e_low, e_high = extra_bits(w, n, p0), extra_bits(w, n, p0 + half)
            if two:
                s2_low, m2_low = scale_and_min(w2, n2, p0)
                s2_high, m2_high = scale_and_min(w2, n2, p0 + half)
                e2_low, e2_high = extra_bits(w2, n2, p0), extra_bits(w2, n2, p0 + half)
            word = w[words_at][n, p0 // VEC] if words else int32(0)  # (bytes p0 .. p0 + 3)
            word2 = w2[words_at][n2, p0 // VEC] if words and two else word
            if hoist:
                for v in range(VEC):
                    xs_low[v], xs_high[v] = x[0, p0 + v], x[0, p0 + v + half]
            for v in range(VEC):
                byte = (word >> (8 * v)) & 255 if words else int32(w[0][n, p0 + v])
                w_low = s_low * float32(nibble(byte & 15, e_low, v)) + m_low
                w_high = s_high * float32(nibble(byte >> 4, e_high, v)) + m_high
                if two:
                    byte2 = (word2 >> (8 * v)) & 255 if words else int32(w2[0][n2, p0 + v])
                    w2_low = s2_low * float32(nibble(byte2 & 15, e2_low, v)) + m2_low
                    w2_high = s2_high * float32(nibble(byte2 >> 4, e2_high, v)) + m2_high
                for m in range(len(acc)):
                    if m < n_rows:
                        x_low = xs_low[v] if hoist else x[m, p0 + v]
                        x_high = xs_high[v] if hoist else x[m, p0 + v + half]
                        acc[m] += w_low * x_low + w_high * x_high
                        if two:
                            acc2[m] += w2_low * x_low + w2_high * x_high
    return row_dots


@device_function
def _q4_scale_and_min(w, n, c):
    """(scale, min) of column c's block of row n: Q4_1's min, Q4_0's -8 scale."""
    scales, mins, has_mins = w[1], w[2], w[3]
    s = float32(scales[n, c // QK])
    return s, float32(mins[n, c // QK]) if has_mins else float32(-8.0) * s


@device_function
def _no_extra_bits(w, n, c):
    return int32(0)


def _q4_row_dots(words: bool):
    return nibble_row_dots(_q4_scale_and_min, _no_extra_bits, words, Q4_WORDS)


def decode_kernel_family(row_dots, fused_qkv: bool = True, gate_up_in_one_pass: bool = True,
                         pairs: bool = True, max_rows: int = GEMV_MAX_ROWS):
    """The decode kernels of one family of packed formats, given its row-dot device
    function row_dots(x, w, n, t, acc, w2, n2, acc2) (w: a matrix's tuple; thread t's
    share of the dots of row n; w2 None, or a second matrix whose row n2 is read in the
    same pass into acc2): (gemv, qkv, gate_up_silu, paired).
    - gemv: one matrix; qkv: q/k/v in one launch (None without fused_qkv: three
      inlined row_dots of the Q5 and K-quant kinds spill registers); gate_up_silu: gate
      and up with SiLU in one launch (their rows read in the same steps, or one after
      the other where that spilled: gate_up_in_one_pass).
    - paired: gemv's signature, a block per two rows of one matrix (matmul.pairs_rows:
      lm_head), where `pairs` and the two-matrix pass fits (gate_up_in_one_pass), else
      None.
    A block a row, grid-stride (as matmul's float GEMVs): its GEMV_ROW_WARPS warps split
    the row, so a row of the packed bytes is a few steps of a thread, each waiting on
    its loads, where a warp a row took four times as many. max_rows: rows of x the
    kernels take (the row_dots loop over len(acc)); at 1 (batch 1) a step's sums hold
    one row, which leaves registers for the fused and paired forms that spilled at 8,
    and for a row_dots that reads a step's quant bytes as one word with its x (one
    wait a step, not five: bench/sass.py)."""

    @jit_bounded(GEMV_BOUNDS)
    def gemv(x, w, bias, has_bias, out):
        t = cuda.threadIdx.x
        sums = cuda.shared.array((GEMV_ROW_WARPS, max_rows), dtype=float32)
        acc = cuda.local.array(max_rows, dtype=float32)
        for n in range(cuda.blockIdx.x, out.shape[1], cuda.gridDim.x):
            row_dots(x, w, n, t, acc, None, n, acc)
            block_sum_rows(acc, x.shape[0], sums)
            _store_rows(out, bias, has_bias, n, acc, t, x.shape[0])

    @jit_bounded(GEMV_BOUNDS)
    def qkv(x, wq, wk, wv, bq, bk, bv, has_bias, q_out, k_out, v_out):
        t = cuda.threadIdx.x
        sums = cuda.shared.array((GEMV_ROW_WARPS, max_rows), dtype=float32)
        nq, nk = q_out.shape[1], k_out.shape[1]
        acc = cuda.local.array(max_rows, dtype=float32)
        for g in range(cuda.blockIdx.x, nq + 2 * nk, cuda.gridDim.x):
            # (a branch per matrix: no array is chosen at run time, which costs registers)
            if g < nq:
                row_dots(x, wq, g, t, acc, None, g, acc)
                block_sum_rows(acc, x.shape[0], sums)
                _store_rows(q_out, bq, has_bias, g, acc, t, x.shape[0])
            elif g < nq + nk:
                row_dots(x, wk, g - nq, t, acc, None, g - nq, acc)
                block_sum_rows(acc, x.shape[0], sums)
                _store_rows(k_out, bk, has_bias, g - nq, acc, t, x.shape[0])
            else:
                row_dots(x, wv, g - nq - nk, t, acc, None, g - nq - nk, acc)
                block_sum_rows(acc, x.shape[0], sums)
                _store_rows(v_out, bv, has_bias, g - nq - nk, acc, t, x.shape[0])

    @jit_bounded(GEMV_BOUNDS)
    def gate_up_silu(x, wg, wu, out):
        t = cuda.threadIdx.x
        sums = cuda.shared.array((GEMV_ROW_WARPS, max_rows), dtype=float32)
        gate = cuda.local.array(max_rows, dtype=float32)
        up = cuda.local.array(max_rows, dtype=float32)
        for n in range(cuda.blockIdx.x, out.shape[1], cuda.gridDim.x):
            if gate_up_in_one_pass:
                row_dots(x, wg, n, t, gate, wu, n, up)
                block_sum_rows(gate, x.shape[0], sums)
            else:
                row_dots(x, wg, n, t, gate, None, n, gate)
                block_sum_rows(gate, x.shape[0], sums)  # (before up's walk: fewer live sums)
                row_dots(x, wu, n, t, up, None, n, up)
            block_sum_rows(up, x.shape[0], sums)
            if t == 0:
                for m in range(max_rows):
                    if m < x.shape[0]:
                        g = gate[m]
                        out[m, n] = g / (float32(1.0) + math.exp(-g)) * up[m]

    @jit_bounded(GEMV_BOUNDS)
    def paired(x, w, bias, has_bias, out):
        """gemv over rows p and p + ceil(N / 2) in one pass (an odd N's middle row
        alone), as matmul.gemv_paired_rows: half the blocks, so half the waves."""
        t = cuda.threadIdx.x
        sums = cuda.shared.array((GEMV_ROW_WARPS, max_rows), dtype=float32)
        acc = cuda.local.array(max_rows, dtype=float32)
        acc2 = cuda.local.array(max_rows, dtype=float32)
        n_rows = out.shape[1]
        half = (n_rows + 1) // 2
        for p in range(cuda.blockIdx.x, half, cuda.gridDim.x):
            n2 = p + half if p + half < n_rows else p  # (p again: the middle row, its sum unused)
            row_dots(x, w, p, t, acc, w, n2, acc2)
            block_sum_rows(acc, x.shape[0], sums)
            block_sum_rows(acc2, x.shape[0], sums)
            _store_rows(out, bias, has_bias, p, acc, t, x.shape[0])
            if n2 != p:
                _store_rows(out, bias, has_bias, n2, acc2, t, x.shape[0])

    return gemv, qkv if fused_qkv else None, gate_up_silu, paired if pairs and gate_up_in_one_pass else None


gemv_q8_0, gemv_q8_0_qkv, gemv_q8_0_gate_up_silu, gemv_q8_0_paired = decode_kernel_family(_q8_0_row_dots)
# (Q4_x's paired kernel spilled 92 bytes; an output matrix in Q4_x is rare: GGUF files keep
# it in Q8_0 or Q6_K)
gemv_q4, gemv_q4_qkv, gemv_q4_gate_up_silu, _ = decode_kernel_family(_q4_row_dots(words=False), pairs=False)
TILED_PACKED = tiled_kernels(_weight)  # (Q8_0 and Q4_x: _weight reads both)
# (gemv, qkv, gate_up_silu, paired) by QuantKind.code, beside kquant_matmul.DECODE_KERNELS
GEMV_FAMILIES = {Q8_0: (gemv_q8_0, gemv_q8_0_qkv, gemv_q8_0_gate_up_silu, gemv_q8_0_paired),
                 **{code: (gemv_q4, gemv_q4_qkv, gemv_q4_gate_up_silu, None) for code in (Q4_0, Q4_1)}}
# the same for one row of x (batch 1), paired too
_Q4_ONE_ROW = decode_kernel_family(_q4_row_dots(words=True), max_rows=1)
ONE_ROW_FAMILIES = {Q8_0: decode_kernel_family(_q8_0_row_dots, max_rows=1), Q4_0: _Q4_ONE_ROW, Q4_1: _Q4_ONE_ROW}


def upload(packed) -> tuple:
    """(device arrays, the GEMVs' matrix, the tiled product's) of a Q8_0 or Q4_x
    PackedWeight: quants as they are (Q8_0's GEMVs read them as int32 words; Q4_x's
    have both, the words last: Q4_WORDS), float16 bits viewed as float16, a placeholder
    for the mins Q8_0 and Q4_0 lack."""
    code = packed.kind.code
    quants = cuda.to_device(packed.quants)
    scales = cuda.to_device(packed.scales.view(np.float16))
    mins = packed.mins if packed.mins is not None else np.zeros((1, 1), np.uint16)
    mins = cuda.to_device(mins.view(np.float16))
    words = quants.view(np.int32)  # (the same bytes, 4 a word)
    has_mins = packed.kind.has_mins
    decode = (words, scales, mins, has_mins) if code == Q8_0 else (quants, scales, mins, has_mins, words)
    return (quants, scales, mins), decode, (quants, scales, mins, code)
