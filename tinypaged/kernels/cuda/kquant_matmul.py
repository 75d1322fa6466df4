"""CUDA products with Q5_0, Q5_1 and K-quant (Q4_K, Q5_K, Q6_K) weights, read in the
host's packed layout (formats/packed.py), never widened whole. A matrix is the tuple
(quants, scales, mins, supers, highs, code), code the kind's (QuantKind.code), and for
the GEMVs the quants again as int32 words (WORDS):
    quants  (N, K/2) uint8 nibbles: byte p holds weight p (low), p + K/2 (high)
    scales  Q5_x: (N, K/32) float16; Q4_K, Q5_K: (N, K/32) uint8 sc; Q6_K: (N, K/16) int8
    mins    Q5_1: (N, K/32) float16; Q4_K, Q5_K: (N, K/32) uint8 m; else a placeholder
    supers  K-quants: (N, K/256, 2) float16 d, dmin (Q6_K: (N, K/256, 1), d); else a
            placeholder
    highs   Q5_x, Q5_K: (N, K/8) uint8 fifth bits in column order; Q6_K: (N, K/4), bits
            4 and 5 as two 32-bit planes a block; Q4_K: a placeholder
Weight = scale * q + min, with scale and min of the weight's block computed from them:
Q5_0 (s, -16 s), Q5_1 (s, m), Q4_K and Q5_K (d sc, -dmin m), Q6_K (d sc, -32 d sc).

The decode GEMVs are packed_matmul's layout (decode_kernel_family): a thread takes
4 consecutive nibble bytes (columns p .. p + 3 and their K/2 partners), which lie in
one 16-weight sub-block, so their scale, min and extra bits are read once (one byte
of highs for all 4). Each kind has its own kernels (DECODE_KERNELS, ONE_ROW_KERNELS for one
row of x, TILED_KERNELS).
x comes rounded to int8 blocks (elementwise), as every
backend's packed products take it; sums are float32.
"""
import numpy as np
from numba import cuda, float32, int32

from ...formats.quant_kind import QK, QK_K, Q4_K, Q5_0, Q5_1, Q5_K, Q6_K
from .device_function import device_function
from .tiled_matmul import tiled_kernels
from .packed_matmul import decode_kernel_family, nibble, nibble_row_dots

WORDS = 6  # the GEMVs' matrix tuple's quants as (N, K/8) int32 words (upload)


def _kind_functions(kind: int):
    """(row_dots_reading, weight) for one kind: the row_dots device function as it reads
    the quants (below), and the tiled products' weight; `kind` its QuantKind's code, a
    compile-time constant in them (the code of the other kinds compiled away: with all five in,
    the fused q/k/v and gate/up GEMVs spilled registers)."""

    @device_function
    def scale_and_min(w, n, c):
        """(scale, min) in float32 of the block of row n holding column c."""
        scales, mins, supers = w[1], w[2], w[3]
        if kind == Q6_K:
            s = float32(supers[n, c // QK_K, 0]) * float32(scales[n, c // 16])
            return s, float32(-32.0) * s
        if kind == Q4_K or kind == Q5_K:
            b = c // QK
            return (float32(supers[n, c // QK_K, 0]) * float32(scales[n, b]),
                    -(float32(supers[n, c // QK_K, 1]) * float32(mins[n, b])))
        s = float32(scales[n, c // QK])
        if kind == Q5_1:
            return s, float32(mins[n, c // QK])
        return s, float32(-16.0) * s  # Q5_0

    @device_function
    def extra_bits(w, n, c):
        """q's bits above the nibble for columns c .. c + 3 of row n (c a multiple of 4):
        bit v is bit 4 of column c + v's q, bit 4 + v its bit 5 (Q6_K only)."""
        highs = w[4]
        if kind == Q4_K:
            return int32(0)
        shift = c % 8
        if kind == Q6_K:
            at = 8 * (c // QK) + (c % QK) // 8  # the block's bit-4 plane; bit 5's 4 bytes on
            return ((int32(highs[n, at]) >> shift) & 15) | (((int32(highs[n, at + 4]) >> shift) & 15) << 4)
        return (int32(highs[n, c // 8]) >> shift) & 15

    def row_dots_reading(words: bool):
        """row_dots (packed_matmul.nibble_row_dots), reading a step's quant bytes as one
        word (the one-row kernels: WORDS) or one at a time."""
        return nibble_row_dots(scale_and_min, extra_bits, words, WORDS)

    @device_function
    def weight(w, n, k, half):
        """Weight (n, k) as float32 (half = K / 2, where the nibble rows fold)."""
        low = k < half
        byte = int32(w[0][n, k if low else k - half])
        s, mn = scale_and_min(w, n, k)
        q = nibble(byte & 15 if low else byte >> 4, extra_bits(w, n, k - k % 4), k % 4)
        return s * float32(q) + mn

    return row_dots_reading, weight


_FUNCTIONS = {code: _kind_functions(code) for code in (Q5_0, Q5_1, Q4_K, Q5_K, Q6_K)}
# the kinds whose gate/up GEMV reads gate's rows, then up's (in one pass they spilled
# 80-228 bytes: each matrix's scales, mins and high bits held at once)
GATE_UP_IN_TWO_PASSES = (Q5_0, Q5_1, Q5_K, Q6_K)
# (gemv, None, gate_up_silu, paired): q, k and v go as three GEMVs (fused, they spilled
# registers); paired (lm_head two rows a block) only where gate and up go in one pass
DECODE_KERNELS = {code: decode_kernel_family(row_dots(words=False), fused_qkv=False,
                                             gate_up_in_one_pass=code not in GATE_UP_IN_TWO_PASSES)
                  for code, (row_dots, _) in _FUNCTIONS.items()}
# for one row of x (batch 1) a step's quant bytes are read as one word (row_dots(words=True)),
# and every form fits 64 registers but Q5_K's pair of rows (112 bytes spilled)
ONE_ROW_WITHOUT_PAIRS = (Q5_K,)
# (gemv, qkv, gate_up_silu, paired) for one row of x: one row's sums leave room for the
# three matrices of q|k|v (packed_matmul.decode_kernel_family's max_rows)
ONE_ROW_KERNELS = {code: decode_kernel_family(row_dots(words=True), max_rows=1,
                                              pairs=code not in ONE_ROW_WITHOUT_PAIRS)
                   for code, (row_dots, _) in _FUNCTIONS.items()}
# q, k and v as three tiled products too (fused: Q6_K's went through 80 bytes of local
# memory), gate and up fused but for Q5_0 (32 bytes spilled)
TILED_KERNELS = {code: tiled_kernels(weight, fuse_qkv=False, fuse_gate_up=code != Q5_0)
                 for code, (_, weight) in _FUNCTIONS.items()}


def upload(packed) -> tuple:
    """(device arrays, the GEMVs' matrix, the tiled product's) of a Q5_x or K-quant
    PackedWeight: (quants, scales, mins, supers, highs) as they are, float16 bits viewed
    as float16, 1-element placeholders for what the kind lacks; both matrices are the
    arrays and the kind's code, the GEMVs' also the quants as int32 words."""
    k_quant = packed.supers is not None
    scales = packed.scales if k_quant else packed.scales.view(np.float16)
    mins = packed.mins if packed.mins is not None else np.zeros((1, 1), np.uint8)
    mins = mins.view(np.float16) if packed.kind.code == Q5_1 else mins
    supers = packed.supers.view(np.float16) if k_quant else np.zeros((1, 1, 2), np.float16)
    highs = packed.highs if packed.highs is not None else np.zeros((1, 1), np.uint8)
    arrays = tuple(cuda.to_device(np.ascontiguousarray(a)) for a in (packed.quants, scales, mins, supers, highs))
    words = arrays[0].view(np.int32)  # (the same bytes, 4 a word: WORDS)
    return arrays, (*arrays, packed.kind.code, words), (*arrays, packed.kind.code)
