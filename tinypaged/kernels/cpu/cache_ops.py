"""CPU kernels for the KV pool: allocate it, write K/V by slot mapping. (Copy-on-write
copies are a handful of block slices per step: the NumPy reference op serves.)

A float16 pool is held as its uint16 bits (numba's CPU target has no float16):
writes round with kv_narrow, attention widens with kv_widen.
"""
import numpy as np
from numba import njit

from .common import kv_narrow


def allocate_kv(shape: tuple[int, ...], dtype=np.float32) -> tuple[np.ndarray, np.ndarray]:
    """K and V pools of `shape` (n_layers, num_blocks, block_size, n_kv, D): float32,
    or float16 as uint16 bits."""
    held = np.uint16 if np.dtype(dtype) == np.float16 else np.dtype(dtype)
    return np.zeros(shape, dtype=held), np.zeros(shape, dtype=held)


@njit(cache=True)
def _write_kv(k_cache, v_cache, k, v, slot_mapping):
    block_size, n_kv, head_dim = k_cache.shape[1], k_cache.shape[2], k_cache.shape[3]
    for t in range(len(slot_mapping)):
        block, offset = slot_mapping[t] // block_size, slot_mapping[t] % block_size
        for h in range(n_kv):
            for d in range(head_dim):
                k_cache[block, offset, h, d] = kv_narrow(k[t, h, d], k_cache)
                v_cache[block, offset, h, d] = kv_narrow(v[t, h, d], v_cache)


def write_kv(k_cache, v_cache, k, v, slot_mapping):
    """Store k, v (T, n_kv, D) at pool slots slot_mapping (T,)."""
    _write_kv(k_cache, v_cache, k, v, slot_mapping)
