"""CPU kernels for the KV pool: write K/V by slot mapping, copy blocks (copy-on-write)."""
from numba import njit


@njit(cache=True)
def _write_kv(k_cache, v_cache, k, v, slot_mapping):
    block_size = k_cache.shape[1]
    for t in range(len(slot_mapping)):
        block, offset = slot_mapping[t] // block_size, slot_mapping[t] % block_size
        k_cache[block, offset] = k[t]
        v_cache[block, offset] = v[t]


def write_kv(k_cache, v_cache, k, v, slot_mapping):
    """Store k, v (T, n_kv, D) at pool slots slot_mapping (T,)."""
    _write_kv(k_cache, v_cache, k, v, slot_mapping)


def copy_blocks(k_cache, v_cache, pairs):
    """Block dst gets block src's K/V in every layer, for each (src, dst); a handful
    per step at most, so plain NumPy slicing is enough."""
    for src, dst in pairs:
        k_cache[..., dst, :, :, :] = k_cache[..., src, :, :, :]
        v_cache[..., dst, :, :, :] = v_cache[..., src, :, :, :]
