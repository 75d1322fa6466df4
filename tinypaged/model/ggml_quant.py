"""GGML tensor types: sizes and dequantisation to float32 (NumPy, vectorised).

Quantised types pack the last (fastest) axis in blocks of 32 values:
    Q8_0: f16 d, i8 q[32]                      x = d * q
    Q4_0: f16 d, u8 qs[16]                     x = d * (q - 8)
    Q4_1: f16 d, f16 m, u8 qs[16]              x = d * q + m
    Q5_0: f16 d, u8 qh[4], u8 qs[16]           x = d * (q - 16)
    Q5_1: f16 d, f16 m, u8 qh[4], u8 qs[16]    x = d * q + m
In Q4_x and Q5_x, byte j holds value j in its low nibble and value j + 16 in its
high one; Q5_x's fifth bits are the 32 bits of qh (little-endian), bit j for value j.

K-quants (what most GGUF files on the hub use) pack 256 values in a super-block of
sub-blocks that carry their own 6- or 8-bit scales (kquant.py has the layouts):
    Q4_K: 144 bytes, Q5_K: 176, Q6_K: 210.
"""
from __future__ import annotations

import math

import numpy as np

F32, F16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, BF16 = 0, 1, 2, 3, 6, 7, 8, 30
Q4_K, Q5_K, Q6_K = 12, 13, 14

GGML_TYPE_NAMES = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 6: "Q5_0", 7: "Q5_1", 8: "Q8_0", 9: "Q8_1",
    10: "Q2_K", 11: "Q3_K", 12: "Q4_K", 13: "Q5_K", 14: "Q6_K", 15: "Q8_K",
    16: "IQ2_XXS", 17: "IQ2_XS", 18: "IQ3_XXS", 19: "IQ1_S", 20: "IQ4_NL", 21: "IQ3_S",
    22: "IQ2_S", 23: "IQ4_XS", 24: "I8", 25: "I16", 26: "I32", 27: "I64", 28: "F64",
    29: "IQ1_M", 30: "BF16",
}

QK = 32  # values per quantisation block
# type -> (values per block, bytes per block)
QK_K = 256  # values per K-quant super-block
BLOCK_LAYOUT = {F32: (1, 4), F16: (1, 2), BF16: (1, 2),
                Q8_0: (QK, 2 + QK), Q4_0: (QK, 2 + QK // 2), Q4_1: (QK, 4 + QK // 2),
                Q5_0: (QK, 6 + QK // 2), Q5_1: (QK, 8 + QK // 2),
                Q4_K: (QK_K, 144), Q5_K: (QK_K, 176), Q6_K: (QK_K, 210)}
K_QUANTS = (Q4_K, Q5_K, Q6_K)
# read, then held as Q8_0: Q5_x rows that PackedWeight cannot keep (an odd number of
# blocks). Every other quantized kind is kept packed (model/packed.py).
REQUANTIZED = (Q5_0, Q5_1)
SUPPORTED = ", ".join(GGML_TYPE_NAMES[t] for t in BLOCK_LAYOUT)


def _check_supported(ggml_type: int, name: str) -> None:
    if ggml_type not in BLOCK_LAYOUT:
        type_name = GGML_TYPE_NAMES.get(ggml_type, f"unknown type {ggml_type}")
        raise ValueError(f"tensor {name!r} uses quantisation type {type_name}, "
                         f"which is not supported (supported: {SUPPORTED})")


def tensor_nbytes(ggml_type: int, shape: tuple[int, ...], name: str) -> int:
    """Bytes a tensor occupies; 0 for a type we cannot size (rejected on load)."""
    if ggml_type not in BLOCK_LAYOUT:
        return 0
    per_block, block_bytes = BLOCK_LAYOUT[ggml_type]
    n = math.prod(shape)  # exact: dims a file lies about must not wrap around int64
    if shape and shape[-1] % per_block:
        raise ValueError(f"tensor {name!r}: last dimension {shape[-1]} is not a multiple of "
                         f"the {GGML_TYPE_NAMES[ggml_type]} block size {per_block}")
    return n // per_block * block_bytes


def dequantize(raw: np.ndarray, ggml_type: int, shape: tuple[int, ...], name: str) -> np.ndarray:
    """raw: uint8 bytes of one tensor -> float32 array of `shape`."""
    _check_supported(ggml_type, name)
    raw = np.asarray(raw, dtype=np.uint8)
    if ggml_type == F32:
        out = raw.view("<f4")
    elif ggml_type == F16:
        out = raw.view("<f2").astype(np.float32)
    elif ggml_type == BF16:
        out = (raw.view("<u2").astype(np.uint32) << 16).view(np.float32)
    elif ggml_type in K_QUANTS:
        from .kquant import dequantize_k
        out = dequantize_k(raw, ggml_type)
    else:
        _, block_bytes = BLOCK_LAYOUT[ggml_type]
        blocks = raw.reshape(-1, block_bytes)  # (n_blocks, block_bytes)
        d = blocks[:, 0:2].copy().view("<f2").astype(np.float32)  # (n_blocks, 1)
        if ggml_type == Q8_0:
            out = d * blocks[:, 2:].view(np.int8).astype(np.float32)
        else:
            qs = blocks[:, -QK // 2:]
            q = np.concatenate([qs & 0x0F, qs >> 4], axis=1).astype(np.float32)  # (n_blocks, 32)
            if ggml_type in (Q5_0, Q5_1):  # the fifth bit of value j: bit j of qh
                start = 2 if ggml_type == Q5_0 else 4
                qh = blocks[:, start:start + 4].copy().view("<u4")  # (n_blocks, 1)
                q += ((qh >> np.arange(QK, dtype=np.uint32)) & 1).astype(np.float32) * 16
            if ggml_type == Q4_0:
                out = d * (q - 8.0)
            elif ggml_type == Q5_0:
                out = d * (q - 16.0)
            else:
                m = blocks[:, 2:4].copy().view("<f2").astype(np.float32)
                out = d * q + m
    return np.ascontiguousarray(out.reshape(shape), dtype=np.float32)


def quantize(w: np.ndarray, ggml_type: int) -> np.ndarray:
    """float (..., K) -> the uint8 bytes of Q8_0, Q4_0 or Q4_1 blocks along the last axis
    (..., K / 32 * block bytes), rounding as llama.cpp's reference quantizers do."""
    w = np.asarray(w, dtype=np.float32)
    _, block_bytes = BLOCK_LAYOUT[ggml_type]
    blocks = w.reshape(-1, QK)  # (n_blocks, 32)
    out = np.zeros((len(blocks), block_bytes), dtype=np.uint8)
    if ggml_type == Q8_0:
        d = np.abs(blocks).max(axis=1) / 127.0
        q = np.round(blocks / np.where(d == 0, 1, d)[:, None])
        out[:, 2:] = np.clip(q, -127, 127).astype(np.int8).view(np.uint8)
    elif ggml_type == Q4_0:  # d from the value of largest magnitude, signed: it maps to -8
        extreme = blocks[np.arange(len(blocks)), np.abs(blocks).argmax(axis=1)]
        d = np.where(extreme == 0, 0.0, extreme / -8.0)  # never -0.0
        q = np.clip(np.round(blocks / np.where(d == 0, 1, d)[:, None] + 8), 0, 15)
        out[:, 2:] = _pack_nibbles(q)
    elif ggml_type == Q4_1:
        low, high = blocks.min(axis=1), blocks.max(axis=1)
        d = (high - low) / 15.0
        q = np.clip(np.round((blocks - low[:, None]) / np.where(d == 0, 1, d)[:, None]), 0, 15)
        out[:, 2:4] = low.astype(np.float16)[:, None].view(np.uint8)
        out[:, 4:] = _pack_nibbles(q)
    else:
        raise ValueError(f"quantizing to {GGML_TYPE_NAMES.get(ggml_type, ggml_type)} is not "
                         f"supported (Q8_0, Q4_0, Q4_1)")
    out[:, 0:2] = d.astype(np.float16)[:, None].view(np.uint8)
    return out.reshape(*w.shape[:-1], -1)


def _pack_nibbles(q: np.ndarray) -> np.ndarray:
    """(n, 32) values 0..15 -> (n, 16) bytes: value j low nibble, value j + 16 high."""
    q = q.astype(np.uint8)
    return q[:, :16] | (q[:, 16:] << 4)
