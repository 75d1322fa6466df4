"""GGML's K-quants (Q4_K, Q5_K, Q6_K): their GGUF super-blocks, read in NumPy (the
reference) and split into PackedWeight's arrays in numba, and the packed arrays'
values and weights. Everything a K-quant's format is lives here; packed.py calls it.

A super-block holds 256 values as 8 sub-blocks of 32 (Q4_K, Q5_K) or 16 of 16
(Q6_K), each with its own small scale, all multiplied by the super-block's
float16 scale(s):
    Q4_K (144 bytes): f16 d, f16 dmin, scales[12], qs[128]
        x = d * sc[j] * q - dmin * mn[j]        q: 4 bits
    Q5_K (176 bytes): f16 d, f16 dmin, scales[12], qh[32], qs[128]
        the same with a 5th bit of q from qh
    Q6_K (210 bytes): ql[128], qh[64], int8 scales[16], f16 d
        x = d * scale[j] * (q - 32)             q: 6 bits (4 from ql, 2 from qh)
Q4_K and Q5_K pack eight 6-bit scales and eight 6-bit mins in 12 bytes: for
sub-block j < 4, scale = b[j] & 63 and min = b[j + 4] & 63; for j >= 4 the low 4
bits come from b[j + 4] (low nibble: scale, high: min) and the top 2 from the top
bits of b[j - 4] (scale) and b[j] (min). In the 4-bit quants, each run of 32 bytes
holds sub-block 2i in its low nibbles and sub-block 2i + 1 in its high ones.

Split (`split`, numba: every row in parallel, each byte read once, no (n, 8, 32)
temporaries, which bound a 1B model's load: bench/NOTES.md), each row's values are
decoded into a scratch row in column order, then packed:
    quants (n, K/2)   column p's low 4 bits | column p + K/2's << 4
    Q6_K:  highs (n, K/4): per 32 columns, 4 bytes of bit 4 then 4 of bit 5;
           scales (n, K/16) int8; supers (n, K/256, 1) d's bits
    Q4_K, Q5_K: scales, mins (n, K/32) the 6-bit sc and m; supers (n, K/256, 2) d and
           dmin's bits; Q5_K highs (n, K/8): the fifth bits, column order
The NumPy readers (dequantize_k) are the reference the tests hold the split to.
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange, uint8

from ..jit_cache import cached_njit
from .quant_kind import KINDS, QK, QK_K, Q5_K, Q6_K, QuantKind

def _half(b: np.ndarray) -> np.ndarray:
    """(n, 2) uint8 little-endian float16 -> (n, 1) float32."""
    return np.ascontiguousarray(b).view("<f2").astype(np.float32)


def scales_and_mins(packed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(n, 12) uint8 -> 6-bit scales (n, 8) and mins (n, 8), uint8."""
    b = packed.astype(np.uint8)
    low, high = b[:, 0:4], b[:, 8:12]  # j < 4 in b[0:4] and b[4:8]; j >= 4 use b[8:12]
    scales = np.concatenate([low & 63, (high & 15) | ((low >> 6) << 4)], axis=1)
    mins = np.concatenate([b[:, 4:8] & 63, (high >> 4) | ((b[:, 4:8] >> 6) << 4)], axis=1)
    return scales, mins


def nibbles(qs: np.ndarray) -> np.ndarray:
    """(n, 128) bytes -> (n, 8, 32) 4-bit values: runs of 32 bytes give sub-blocks
    2i (low nibbles) and 2i + 1 (high nibbles)."""
    runs = qs.reshape(-1, 4, 32)
    return np.stack([runs & 15, runs >> 4], axis=2).reshape(-1, 8, 32)


def q6_values(blocks: np.ndarray) -> np.ndarray:
    """(n, 210) Q6_K super-blocks -> (n, 8, 32) 6-bit values q (0 .. 63), GGUF order:
    each half (128 values) reads 64 bytes of ql (low nibbles) and 32 of qh (two bits
    a value), as four runs of 32."""
    ql, qh = blocks[:, 0:128], blocks[:, 128:192]
    halves = []
    for h in range(2):
        low, high = ql[:, 64 * h:64 * h + 32], ql[:, 64 * h + 32:64 * h + 64]
        bits = qh[:, 32 * h:32 * h + 32]
        q = [(low & 15) | ((bits & 3) << 4), (high & 15) | (((bits >> 2) & 3) << 4),
             (low >> 4) | (((bits >> 4) & 3) << 4), (high >> 4) | (((bits >> 6) & 3) << 4)]
        halves.append(np.stack(q, axis=1))  # (n, 4, 32)
    return np.concatenate(halves, axis=1)


def q5_k_fifth_bits(qh: np.ndarray) -> np.ndarray:
    """(n, 32) Q5_K qh bytes -> (n, 8, 32) fifth bits (0 or 1): bit j of byte l is the
    fifth bit of value l of sub-block j."""
    return (qh[:, None, :] >> np.arange(8, dtype=np.uint8)[None, :, None]) & 1


def dequantize_k(raw: np.ndarray, ggml_type: int) -> np.ndarray:
    """raw uint8 bytes of whole super-blocks -> float32 values (flat)."""
    blocks = np.asarray(raw, dtype=np.uint8).reshape(-1, KINDS[ggml_type].block_bytes)
    if ggml_type == Q6_K:
        scales = blocks[:, 192:208].view(np.int8).astype(np.float32)  # (n, 16)
        d = _half(blocks[:, 208:210])  # (n, 1)
        q = q6_values(blocks).astype(np.float32) - 32.0  # (n, 8, 32)
        sub = scales.reshape(-1, 8, 2)  # each run of 32 has two 16-value scales
        scale = np.repeat(sub, 16, axis=2)  # (n, 8, 32)
        return (d[:, :, None] * scale * q).reshape(-1)
    d, dmin = _half(blocks[:, 0:2]), _half(blocks[:, 2:4])  # (n, 1) each
    scales, mins = (a.astype(np.float32) for a in scales_and_mins(blocks[:, 4:16]))
    q = nibbles(blocks[:, -128:]).astype(np.float32)  # (n, 8, 32)
    if ggml_type == Q5_K:
        q += 16.0 * q5_k_fifth_bits(blocks[:, 16:48])
    return ((d * scales)[:, :, None] * q - (dmin * mins)[:, :, None]).reshape(-1)


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


def split(raw: np.ndarray, ggml_type: int, shape: tuple[int, int]) -> tuple:
    """A K-quant tensor's GGUF bytes -> PackedWeight's arrays (quants, scales, mins,
    supers, highs; None where the kind has none)."""
    n, k = shape
    blocks = np.asarray(raw, dtype=np.uint8).reshape(n * k // QK_K, KINDS[ggml_type].block_bytes)
    quants = np.empty((n, k // 2), np.uint8)
    if ggml_type == Q6_K:
        highs, scales = np.empty((n, k // 4), np.uint8), np.empty((n, k // 16), np.int8)
        supers = np.empty((n, k // QK_K, 1), np.uint16)
        unpack_q6_k(blocks, quants, highs, scales, supers)
        return quants, scales, None, supers, highs
    scales, mins = np.empty((n, k // QK), np.uint8), np.empty((n, k // QK), np.uint8)
    supers = np.empty((n, k // QK_K, 2), np.uint16)
    fifths = ggml_type == Q5_K
    highs = np.empty((n, k // 8) if fifths else (1, 1), np.uint8)
    unpack_q45_k(blocks, quants, scales, mins, supers, highs, fifths)
    return quants, scales, mins, supers, highs if fifths else None


def high_values(kind: QuantKind, highs: np.ndarray) -> np.ndarray:
    """A PackedWeight's highs (r, ...) -> the bits above q's low nibble, (r, K) uint8 in
    column order: Q6_K's two bit planes a block of 32, or (Q5_x, Q5_K) the fifth bits."""
    if kind.code == Q6_K:
        planes = np.unpackbits(highs.reshape(len(highs), -1, 2, 4), axis=3, bitorder="little")
        return ((planes[:, :, 0] << 4) | (planes[:, :, 1] << 5)).reshape(len(highs), -1)
    return np.unpackbits(highs, axis=1, bitorder="little") << 4


def weights(kind: QuantKind, q: np.ndarray, scales: np.ndarray, mins, supers: np.ndarray) -> np.ndarray:
    """float32 (r, K) weights of rows whose values are q (r, K), from their packed
    scales, mins and supers, as gguf's dequantizer rounds: Q6_K (d * sc) * (q - 32),
    Q4_K and Q5_K (d * sc) * q - dmin * m."""
    if kind.code == Q6_K:
        d = np.repeat(supers[:, :, 0].view(np.float16).astype(np.float32), QK_K // 16, axis=1)
        return np.repeat(d * scales.astype(np.float32), 16, axis=1) * (q - np.float32(32))
    d, dmin = (np.repeat(supers[:, :, i].view(np.float16).astype(np.float32), QK_K // QK, axis=1)
               for i in (0, 1))
    scale = np.repeat(d * scales.astype(np.float32), QK, axis=1)
    return scale * q - np.repeat(dmin * mins.astype(np.float32), QK, axis=1)
