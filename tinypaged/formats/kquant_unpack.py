"""GGUF K-quant super-blocks split into PackedWeight's arrays (packed.py), in numba:
every row in parallel, each byte read once, no (n, 8, 32) temporaries (the load
of a 1B model's K-quants would otherwise be bound by them: bench/NOTES.md);
kquant.py stays the reference the tests hold both to.

Each row's 6- or 4-bit values are decoded into a scratch row in column order first
(a row's nibble pairs join columns p and p + K/2), then packed:
    quants (n, K/2)   column p's low 4 bits | column p + K/2's << 4
    Q6_K:  highs (n, K/4): per 32 columns, 4 bytes of bit 4 then 4 of bit 5;
           scales (n, K/16) int8; supers (n, K/256, 1) d's bits
    Q4_K, Q5_K: scales, mins (n, K/32) the 6-bit sc and m; supers (n, K/256, 2) d and
           dmin's bits; Q5_K highs (n, K/8): the fifth bits, column order
"""
import numpy as np
from numba import njit, prange, uint8

from ..jit_cache import cached_njit



@njit(inline="always")
def _pack_rows(values, quants, r):
    """quants[r] = the scratch row's values as nibble pairs (p, p + K/2)."""
    half = quants.shape[1]
    for p in range(half):
        quants[r, p] = (values[p] & 15) | ((values[p + half] & 15) << 4)


@cached_njit(parallel=True)
def unpack_q6_k(blocks, quants, highs, scales, supers):
    """blocks (n * K/256, 210) uint8 -> the four arrays (module docstring)."""
    n, k = quants.shape[0], 2 * quants.shape[1]
    per_row = k // 256
    for r in prange(n):
        values = np.empty(k, np.uint8)
        for s in range(per_row):
            b = blocks[r * per_row + s]
            for h in range(2):  # each half: 64 bytes of low nibbles, 32 of two-bit pairs
                at = 256 * s + 128 * h
                for i in range(32):
                    low, high, bits = b[64 * h + i], b[64 * h + 32 + i], b[128 + 32 * h + i]
                    values[at + i] = (low & 15) | ((bits & 3) << 4)
                    values[at + 32 + i] = (high & 15) | (((bits >> 2) & 3) << 4)
                    values[at + 64 + i] = (low >> 4) | (((bits >> 4) & 3) << 4)
                    values[at + 96 + i] = (high >> 4) | (((bits >> 6) & 3) << 4)
            for i in range(16):
                scales[r, 16 * s + i] = np.int8(b[192 + i])
            supers[r, s, 0] = np.uint16(b[208]) | (np.uint16(b[209]) << 8)
        _pack_rows(values, quants, r)
        for block in range(k // 32):
            for i in range(4):
                four, five = uint8(0), uint8(0)
                for j in range(8):
                    v = values[32 * block + 8 * i + j]
                    four |= ((v >> 4) & 1) << j
                    five |= ((v >> 5) & 1) << j
                highs[r, 8 * block + i], highs[r, 8 * block + 4 + i] = four, five


@cached_njit(parallel=True)
def unpack_q45_k(blocks, quants, scales, mins, supers, highs, fifths):
    """blocks (n * K/256, 144 or 176) uint8 -> quants, scales, mins, supers, and with
    fifths (Q5_K) the highs (module docstring)."""
    n, k = quants.shape[0], 2 * quants.shape[1]
    per_row = k // 256
    qs_at = 48 if fifths else 16
    for r in prange(n):
        values = np.empty(k, np.uint8)
        for s in range(per_row):
            b = blocks[r * per_row + s]
            supers[r, s, 0] = np.uint16(b[0]) | (np.uint16(b[1]) << 8)
            supers[r, s, 1] = np.uint16(b[2]) | (np.uint16(b[3]) << 8)
            for j in range(4):  # 6-bit sc and m: kquant.scales_and_mins' layout
                scales[r, 8 * s + j], mins[r, 8 * s + j] = b[4 + j] & 63, b[8 + j] & 63
                scales[r, 8 * s + 4 + j] = (b[12 + j] & 15) | ((b[4 + j] >> 6) << 4)
                mins[r, 8 * s + 4 + j] = (b[12 + j] >> 4) | ((b[8 + j] >> 6) << 4)
            for i in range(4):  # run i: sub-block 2i in the low nibbles, 2i + 1 in the high
                at = 256 * s + 64 * i
                for l in range(32):
                    q = b[qs_at + 32 * i + l]
                    values[at + l], values[at + 32 + l] = q & 15, q >> 4
            if fifths:  # bit j of qh[l]: the fifth bit of sub-block j's value l
                for j in range(8):
                    for byte in range(4):
                        bits = uint8(0)
                        for t in range(8):
                            bits |= ((b[16 + 8 * byte + t] >> j) & 1) << t
                        highs[r, 32 * s + 4 * j + byte] = bits
        _pack_rows(values, quants, r)
