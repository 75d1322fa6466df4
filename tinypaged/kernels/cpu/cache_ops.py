"""CPU kernels for the KV pool: allocate it, write K/V by slot mapping. (Copy-on-write
copies are a handful of block slices per step: the NumPy reference op serves.)

K is held transposed within each block: (n_layers, num_blocks, n_kv, D, block_size),
so a block's keys' values of one dimension lie side by side and decode attention
scores 16 keys in the lanes of one vector (attention_ir.key_scores), with no sum
across lanes; V keeps the rows (n_layers, num_blocks, block_size, n_kv, D) that its
weighted sum reads. A float16 pool is held as its uint16 bits (numba's CPU target
has no float16): writes round with kv_narrow, attention widens with kv_widen. An int8
pool holds kv_q8.py's rows (D values, then their scales' bytes) in place of D values:
K's block then (n_kv, D + D/16, block_size), its last rows the keys' scales' bytes.
"""
import mmap

import numpy as np
from numba import float32, int8, prange

from ...jit_cache import cached_njit
from ..kv_q8 import KV_BLOCK, KV_INT8, row_width
from .common import f32_to_f16_bits, kv_narrow
from .elementwise import rope_row
from .linear import blas_in_use

THREADED_TOKENS = 8  # tokens from which rope_write_kv runs on numba's threads (a decode of 1 costs ~9 us)


def allocate_kv(shape: tuple[int, ...], dtype=np.float32) -> tuple[np.ndarray, np.ndarray]:
    """K and V pools for `shape` (n_layers, num_blocks, block_size, n_kv, D): V of that
    shape, K transposed in each block (keys_layout); float32, or float16 as uint16 bits."""
    held = np.uint16 if np.dtype(dtype) == np.float16 else np.dtype(dtype)
    if held == KV_INT8:
        shape = (*shape[:-1], row_width(shape[-1]))
    return small_pages(keys_layout(shape), held), small_pages(shape, held)


def small_pages(shape: tuple[int, ...], dtype) -> np.ndarray:
    """A zeroed array in 4 KB pages: a block's first write commits its own pages, not a
    2 MB page a layer. (numpy asks for huge pages for large arrays: SmolLM2's first
    request of 6 tokens then committed 120 MB of the pool, 0.3-0.5 s on a VM that backs
    its memory at first touch; warm start and RSS follow the blocks used instead.)"""
    count = int(np.prod(shape))
    memory = mmap.mmap(-1, max(1, count * np.dtype(dtype).itemsize))  # (anonymous: zeros)
    if hasattr(mmap, "MADV_NOHUGEPAGE"):  # (Linux)
        memory.madvise(mmap.MADV_NOHUGEPAGE)
    return np.frombuffer(memory, dtype, count).reshape(shape)


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
    (_write_kv_q8 if k_cache.dtype == KV_INT8 else _write_kv)(k_cache, v_cache, k, v, slot_mapping)


@cached_njit(error_model="numpy")
def store_q8(x, out):
    """out (D + D/16,) int8, a strided view if need be = x (D,) float32 as kv_q8.py's row:
    per block of 32, d = max|x| / 127, q = round-half-even(x * (1 / d)), then the
    scales' float16 bytes (the same float32 steps as kv_q8.quantize_rows)."""
    head_dim = x.shape[0]
    for c in range(head_dim // KV_BLOCK):
        amax = float32(0.0)
        for i in range(c * KV_BLOCK, (c + 1) * KV_BLOCK):
            amax = max(amax, abs(x[i]))
        d = float32(amax / float32(127.0))  # (numba divides in float64: round once)
        inverse = float32(float32(1.0) / d) if d > 0 else float32(0.0)
        for i in range(c * KV_BLOCK, (c + 1) * KV_BLOCK):
            out[i] = int8(np.rint(x[i] * inverse))
        bits = np.int32(f32_to_f16_bits(d))
        out[head_dim + 2 * c] = int8(bits & 255)
        out[head_dim + 2 * c + 1] = int8(bits >> 8)


@cached_njit(error_model="numpy")
def _write_kv_q8(k_cache, v_cache, k, v, slot_mapping):
    block_size = v_cache.shape[1]
    for t in range(len(slot_mapping)):
        block, offset = slot_mapping[t] // block_size, slot_mapping[t] % block_size
        for h in range(k.shape[1]):
            store_q8(k[t, h], k_cache[block, h, :, offset])
            store_q8(v[t, h], v_cache[block, offset, h])


@cached_njit(fastmath=True, inline="always")
def _rope_write_token(t, q, k, v, positions, cos_table, sin_table, k_cache, v_cache, slot_mapping, q_out):
    """Token t's q rotated into q_out, its k rotated and v stored at its slot, in one
    pass (no rotated k array in between: at decode, three calls and two allocations
    were ~3/4 of the op's 9 us)."""
    block_size, p = v_cache.shape[1], positions[t]
    for h in range(q.shape[1]):
        rope_row(q[t, h], cos_table[p], sin_table[p], q_out[t, h])
    block, offset = slot_mapping[t] // block_size, slot_mapping[t] % block_size
    for h in range(k.shape[1]):
        rope_row(k[t, h], cos_table[p], sin_table[p], k_cache[block, h, :, offset])
        v_row = v_cache[block, offset, h]
        for d in range(k.shape[2]):
            v_row[d] = kv_narrow(v[t, h, d], v_cache)


@cached_njit(fastmath=True)
def _rope_write_kv(q, k, v, positions, cos_table, sin_table, k_cache, v_cache, slot_mapping, q_out):
    for t in range(len(slot_mapping)):
        _rope_write_token(t, q, k, v, positions, cos_table, sin_table, k_cache, v_cache, slot_mapping, q_out)


@cached_njit(fastmath=True, parallel=True)
def _rope_write_kv_threads(q, k, v, positions, cos_table, sin_table, k_cache, v_cache, slot_mapping, q_out):
    """_rope_write_kv's tokens on numba's threads (each writes its own slot): a K row
    lands in a transposed block a value a cache line (keys_layout), so 32 tokens of
    Qwen3-0.6B's 8 heads of 128 took ~120 us on one core."""
    for t in prange(len(slot_mapping)):
        _rope_write_token(t, q, k, v, positions, cos_table, sin_table, k_cache, v_cache, slot_mapping, q_out)


@cached_njit(fastmath=True, error_model="numpy")
def _rope_write_kv_q8(q, k, v, positions, cos_table, sin_table, k_cache, v_cache, slot_mapping,
                      q_out):
    """_rope_write_kv into an int8 pool: each rotated k row quantized as it is stored."""
    block_size = v_cache.shape[1]
    rotated = np.empty(k.shape[2], np.float32)
    for t in range(len(slot_mapping)):
        p = positions[t]
        for h in range(q.shape[1]):
            rope_row(q[t, h], cos_table[p], sin_table[p], q_out[t, h])
        block, offset = slot_mapping[t] // block_size, slot_mapping[t] % block_size
        for h in range(k.shape[1]):
            rope_row(k[t, h], cos_table[p], sin_table[p], rotated)
            store_q8(rotated, k_cache[block, h, :, offset])
            store_q8(v[t, h], v_cache[block, offset, h])


def rope_write_kv(q, k, v, positions, cos_table, sin_table, k_cache, v_cache, slot_mapping):
    """Rotate q (T, n_heads, D) and k (T, n_kv, D), store k and v at their slots;
    returns the rotated q (reference.rope_write_kv)."""
    q_out = np.empty_like(q)
    threads = len(slot_mapping) >= THREADED_TOKENS and not blas_in_use()  # (attention.py says why)
    write = _rope_write_kv_q8 if k_cache.dtype == KV_INT8 else _rope_write_kv_threads if threads else _rope_write_kv
    write(q, k, v, positions, cos_table, sin_table, k_cache, v_cache, slot_mapping, q_out)
    return q_out
