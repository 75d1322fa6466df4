"""Dequantizing GGML's K-quants (Q4_K, Q5_K, Q6_K) in NumPy.

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
"""
from __future__ import annotations

import numpy as np

from .quant_kind import KINDS, Q5_K, Q6_K


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
