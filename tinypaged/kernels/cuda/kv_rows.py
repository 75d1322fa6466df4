"""How the CUDA kernels read and write a layer's KV pool.

A float32 or float16 pool is one array (num_blocks, block_size, n_kv, D): a kernel
widens a value on read and rounds it on write. An int8 pool holds kernels/kv_q8.py's
rows, and a kernel gets a layer of it as the pair (rows, scales): rows (num_blocks,
block_size, n_kv, D + D/16) int8, and scales the same memory seen as float16 from
element D/2 of a row on, (num_blocks, block_size, n_kv, D/32), so no kernel decodes
float16 bits by hand.

The kernels that read the pool are built once per form from the device functions
below (`POOL_READS`): `value` is what a kernel reads at (block, offset, kvh, d), and
`rows` the array whose shape gives block_size and n_kv.
"""
from __future__ import annotations

import numpy as np
from numba import cuda, float32, int8

from ..kv_q8 import KV_BLOCK, head_dim_of
from .device_function import device_function
from .disk_cache import cached_kernel
from .elementwise import block_step, rotate_pair, to_int_step
from .warp import FULL_MASK, WARP

BLOCK_LANES = KV_BLOCK // 2  # threads that quantize one block of 32 values, two each
MAX_HEAD_DIM = 128  # the widest head the kernels take: the bound of shared per-head arrays


class Q8Pool:
    """The K or V half of an int8 pool: rows (n_layers, num_blocks, block_size, n_kv,
    D + D/16) int8; `pool[layer]` is the (rows, scales) pair the kernels take."""

    def __init__(self, rows):
        self.rows = rows
        head_dim = head_dim_of(rows.shape[4])  # (the simulator's shapes take no [-1])
        scales = rows.view(np.float16)[:, :, :, :, head_dim // 2:]
        self.layers = [(rows[i], scales[i]) for i in range(rows.shape[0])]  # (made once)

    def __getitem__(self, layer):
        return self.layers[layer]

    def copy_to_host(self) -> np.ndarray:
        return self.rows.copy_to_host()


def layer_rows(pool):
    """The array of a layer's pool whose shape is (num_blocks, block_size, n_kv, row)."""
    return pool[0] if isinstance(pool, tuple) else pool


def pool_rows(pool):
    """The array a copy of blocks moves: a float pool itself, an int8 pool's rows."""
    return pool.rows if isinstance(pool, Q8Pool) else pool


@device_function
def float_value(pool, block, offset, kvh, d):
    return float32(pool[block, offset, kvh, d])


@device_function
def float_rows(pool):
    return pool


@device_function
def q8_value(pool, block, offset, kvh, d):
    rows, scales = pool
    return float32(rows[block, offset, kvh, d]) * float32(scales[block, offset, kvh, d // KV_BLOCK])


@cuda.jit(device=True, inline="always")  # (returns an array it did not take: allowed only inlined)
def q8_rows(pool):
    return pool[0]


POOL_READS = {"": (float_value, float_rows), "q8": (q8_value, q8_rows)}  # form -> (value, rows)


def pool_form(pool) -> str:
    """The key of POOL_READS that reads this layer's pool (a (rows, scales) pair: int8)."""
    return "q8" if isinstance(pool, tuple) else ""


@device_function
def store_q8(staged, pool, block, offset, kvh, i, head_dim):
    """Thread i of a block (a multiple of 32 threads) quantizes values 2i and 2i + 1 of
    the row staged in shared memory (head_dim values) into the pool's row (block,
    offset, kvh), as kv_q8.quantize_rows does, bit for bit: the 16 threads of a block
    of 32 values find its largest magnitude by four shuffles inside their half-warp,
    and its first thread writes the scale. Threads past the row take part in the
    shuffles only (head_dim / 2 is a multiple of 16: a half-warp is all in or out)."""
    rows, scales = pool
    live = 2 * i < head_dim
    x0 = staged[2 * i] if live else float32(0.0)
    x1 = staged[2 * i + 1] if live else float32(0.0)
    amax = max(abs(x0), abs(x1))
    width = BLOCK_LANES // 2
    while width > 0:  # (8, 4, 2, 1: lanes of one half-warp)
        amax = max(amax, cuda.shfl_xor_sync(FULL_MASK, amax, width))
        width //= 2
    d, inverse = block_step(amax)
    if live:
        rows[block, offset, kvh, 2 * i] = int8(to_int_step(x0, inverse))
        rows[block, offset, kvh, 2 * i + 1] = int8(to_int_step(x1, inverse))
        if i % BLOCK_LANES == 0:
            scales[block, offset, kvh, i // BLOCK_LANES] = d  # (rounded to float16)


def rope_write_threads(head_dim: int) -> int:
    """rope_write_kv_q8's block: a thread per pair of values, whole warps."""
    return -(-head_dim // 2 // WARP) * WARP


@cached_kernel()
def rope_write_kv_q8(q, k, v, positions, cos_table, sin_table, k_cache, v_cache, slot_mapping):
    """elementwise.rope_write_kv into an int8 pool (k_cache, v_cache: (rows, scales)).
    Grid (T, n_heads + n_kv), block rope_write_threads(D). A query head's block rotates
    q[t, j] in place; a KV head's block stages its rotated k and its v in shared
    memory, then quantizes both into slot slot_mapping[t] (store_q8). A padding row
    (position -1) exits at once."""
    k_s = cuda.shared.array(MAX_HEAD_DIM, dtype=float32)
    v_s = cuda.shared.array(MAX_HEAD_DIM, dtype=float32)
    t, j, i = cuda.blockIdx.x, cuda.blockIdx.y, cuda.threadIdx.x
    head_dim = q.shape[2]
    half = head_dim // 2
    p = positions[t]
    if p < 0:  # (the whole block returns)
        return
    n_heads = q.shape[1]
    if j < n_heads:  # (the whole block: no barrier below is left waiting)
        if i < half:
            q[t, j, i], q[t, j, i + half] = rotate_pair(q[t, j, i], q[t, j, i + half],
                                                        cos_table[p, i], sin_table[p, i])
        return
    kvh = j - n_heads
    if i < half:
        k_s[i], k_s[i + half] = rotate_pair(k[t, kvh, i], k[t, kvh, i + half],
                                            cos_table[p, i], sin_table[p, i])
        v_s[i], v_s[i + half] = v[t, kvh, i], v[t, kvh, i + half]
    cuda.syncthreads()  # both rows staged
    block_size = k_cache[0].shape[1]
    block, offset = slot_mapping[t] // block_size, slot_mapping[t] % block_size
    store_q8(k_s, k_cache, block, offset, kvh, i, head_dim)
    store_q8(v_s, v_cache, block, offset, kvh, i, head_dim)
