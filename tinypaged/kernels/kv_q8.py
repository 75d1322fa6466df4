"""The int8 KV cache's rows (kv_cache_dtype="int8"), as llama.cpp's q8_0 cache holds
them: a row (one token's K or V for one KV head, D values) is cut into blocks of 32,
each with its values in int8 and one float16 scale. A row is held as D + D/16 int8:
its D values, then its D/32 scales' bytes (float16, little-endian), so a pool of such
rows is one int8 array and copying a block copies its scales with it.

Per block of 32 values x: d = max|x| / 127 and q = round-half-even(x * (1 / d)) in
float32 (0 where d is 0), as the activations are rounded (reference.quantize_activations);
the scale is stored as float16(d), and the value held is q * float16(d). Half the bytes
of a float16 cache, plus 1/16 for the scales.

This module is the spec (NumPy); the CPU kernels compute the same rows (cpu/cache_ops.py).
"""
from __future__ import annotations

import numpy as np

KV_INT8 = np.dtype(np.int8)
KV_BLOCK = 32  # values a scale covers


def row_width(head_dim: int) -> int:
    """int8 elements of a row of head_dim values: the values and the scales' bytes."""
    return head_dim + 2 * (head_dim // KV_BLOCK)


def head_dim_of(width: int) -> int:
    """The head_dim whose rows are `width` int8 elements (row_width's inverse)."""
    return (width * KV_BLOCK) // (KV_BLOCK + 2)


def check_head_dim(head_dim: int) -> None:
    if head_dim % KV_BLOCK:
        raise ValueError(f"kv_cache_dtype='int8' keeps a scale per {KV_BLOCK} values of a head, and "
                         f"head_dim={head_dim} is not a multiple of {KV_BLOCK}: use float16")


def quantize_rows(x: np.ndarray) -> np.ndarray:
    """x (..., D) float32 -> rows (..., D + D/16) int8."""
    x = np.asarray(x, dtype=np.float32)
    head_dim = x.shape[-1]
    blocks = x.reshape(*x.shape[:-1], head_dim // KV_BLOCK, KV_BLOCK)
    d = np.abs(blocks).max(axis=-1) / np.float32(127)
    inverse = np.divide(np.float32(1), d, out=np.zeros_like(d), where=d > 0)
    q = np.rint(blocks * inverse[..., None]).astype(np.int8).reshape(x.shape)
    scales = d.astype(np.float16).view(np.uint8).view(np.int8)  # (..., D/32 * 2) bytes
    return np.concatenate([q, scales.reshape(*x.shape[:-1], -1)], axis=-1)


def dequantize_rows(rows: np.ndarray) -> np.ndarray:
    """rows (..., D + D/16) int8 -> the values they hold (..., D) float32."""
    head_dim = head_dim_of(rows.shape[-1])
    q = rows[..., :head_dim].astype(np.float32)
    scales = np.ascontiguousarray(rows[..., head_dim:]).view(np.float16).astype(np.float32)
    return (q.reshape(*rows.shape[:-1], head_dim // KV_BLOCK, KV_BLOCK) * scales[..., None]).reshape(q.shape)
