"""CPU kernel for the KV pool: write K/V by slot mapping. (Copy-on-write copies are
a handful of block slices per step: the NumPy reference op serves as it is.)"""
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
