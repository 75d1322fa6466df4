"""CPU kernels for the KV pool: allocate it, write K/V by slot mapping. (Copy-on-write
copies are a handful of block slices per step: the NumPy reference op serves.)

K is held transposed within each block: (n_layers, num_blocks, n_kv, D, block_size),
so a block's keys' values of one dimension lie side by side and decode attention
scores 16 keys in the lanes of one vector (attention_ir.key_scores), with no sum
across lanes; V keeps the rows (n_layers, num_blocks, block_size, n_kv, D) that its
weighted sum reads. A float16 pool is held as its uint16 bits (numba's CPU target
has no float16): writes round with kv_narrow, attention widens with kv_widen.
"""
import numpy as np

from ...jit_cache import cached_njit
from .common import kv_narrow
from .elementwise import rope_row


def allocate_kv(shape: tuple[int, ...], dtype=np.float32) -> tuple[np.ndarray, np.ndarray]:
    """K and V pools for `shape` (n_layers, num_blocks, block_size, n_kv, D): V of that
    shape, K transposed in each block (keys_layout); float32, or float16 as uint16 bits."""
    held = np.uint16 if np.dtype(dtype) == np.float16 else np.dtype(dtype)
    return np.zeros(keys_layout(shape), dtype=held), np.zeros(shape, dtype=held)


def keys_layout(shape: tuple[int, ...]) -> tuple[int, ...]:
    """The K pool's shape for a pool of shape (..., num_blocks, block_size, n_kv, D)."""
    *lead, block_size, n_kv, head_dim = shape
    return (*lead, n_kv, head_dim, block_size)


def keys_from_rows(k_rows: np.ndarray) -> np.ndarray:
    """A K pool held as rows (..., block_size, n_kv, D), as this backend holds it."""
    return np.ascontiguousarray(np.moveaxis(k_rows, -3, -1))


@cached_njit()
def _write_kv(k_cache, v_cache, k, v, slot_mapping):
    block_size, n_kv, head_dim = v_cache.shape[1], v_cache.shape[2], v_cache.shape[3]
    for t in range(len(slot_mapping)):
        block, offset = slot_mapping[t] // block_size, slot_mapping[t] % block_size
        for h in range(n_kv):
            for d in range(head_dim):
                k_cache[block, h, d, offset] = kv_narrow(k[t, h, d], k_cache)
                v_cache[block, offset, h, d] = kv_narrow(v[t, h, d], v_cache)


def write_kv(k_cache, v_cache, k, v, slot_mapping):
    """Store k, v (T, n_kv, D) at pool slots slot_mapping (T,)."""
    _write_kv(k_cache, v_cache, k, v, slot_mapping)


@cached_njit(fastmath=True)
def _rope_write_kv(q, k, v, positions, cos_table, sin_table, k_cache, v_cache, slot_mapping,
                   q_out):
    """q_out = rope(q); k rotated and v stored at their slots, in one pass (no rotated
    k array in between): at decode, three calls and two allocations were ~3/4 of the
    op's 9 us."""
    block_size, n_kv = v_cache.shape[1], v_cache.shape[2]
    for t in range(len(slot_mapping)):
        p = positions[t]
        for h in range(q.shape[1]):
            rope_row(q[t, h], cos_table[p], sin_table[p], q_out[t, h])
        block, offset = slot_mapping[t] // block_size, slot_mapping[t] % block_size
        for h in range(n_kv):
            rope_row(k[t, h], cos_table[p], sin_table[p], k_cache[block, h, :, offset])
            v_row = v_cache[block, offset, h]
            for d in range(k.shape[2]):
                v_row[d] = kv_narrow(v[t, h, d], v_cache)


def rope_write_kv(q, k, v, positions, cos_table, sin_table, k_cache, v_cache, slot_mapping):
    """Rotate q (T, n_heads, D) and k (T, n_kv, D), store k and v at their slots;
    returns the rotated q (reference.rope_write_kv)."""
    q_out = np.empty_like(q)
    _rope_write_kv(q, k, v, positions, cos_table, sin_table, k_cache, v_cache, slot_mapping, q_out)
    return q_out
