"""GGML blocks to float32 and back, in NumPy (vectorised): the reference of every
kind's arithmetic (quant_kind.py has the layouts)."""
from __future__ import annotations

import numpy as np

from .kquant import dequantize_k
from .quant_kind import BF16, F16, F32, K_QUANTS, KINDS, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, QK, check_supported


def dequantize(raw: np.ndarray, ggml_type: int, shape: tuple[int, ...], name: str) -> np.ndarray:
    """raw: uint8 bytes of one tensor -> float32 array of `shape`."""
    check_supported(ggml_type, name)
    raw = np.asarray(raw, dtype=np.uint8)
    if ggml_type == F32:
        out = raw.view("<f4")
    elif ggml_type == F16:
        out = raw.view("<f2").astype(np.float32)
    elif ggml_type == BF16:
        out = (raw.view("<u2").astype(np.uint32) << 16).view(np.float32)
    elif ggml_type in K_QUANTS:
        out = dequantize_k(raw, ggml_type)
    else:
        blocks = raw.reshape(-1, KINDS[ggml_type].block_bytes)  # (n_blocks, block_bytes)
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
    blocks = w.reshape(-1, QK)  # (n_blocks, 32)
    out = np.zeros((len(blocks), KINDS[ggml_type].block_bytes), dtype=np.uint8)
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
        raise ValueError(f"quantizing to {KINDS[ggml_type].name if ggml_type in KINDS else ggml_type} is not "
                         f"supported (Q8_0, Q4_0, Q4_1)")
    out[:, 0:2] = d.astype(np.float16)[:, None].view(np.uint8)
    return out.reshape(*w.shape[:-1], -1)


def _pack_nibbles(q: np.ndarray) -> np.ndarray:
    """(n, 32) values 0..15 -> (n, 16) bytes: value j low nibble, value j + 16 high."""
    q = q.astype(np.uint8)
    return q[:, :16] | (q[:, 16:] << 4)
