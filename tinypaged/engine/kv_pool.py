"""How many KV blocks the pool gets, and the memory checks made before anything is
allocated (the pool, its bookkeeping, the RoPE tables).

Default pool: only max_num_seqs sequences of at most max_model_len tokens can be
live at once, so the pool never needs more than what they hold while they decode
(in a sliding KV group, only the window's blocks) plus what one long prompt takes
on admission (every block, in every group). A margin on top keeps freed prefixes
findable in the prefix cache. The backend's share of free
memory caps it (a fifth of RAM on the CPU, gpu_memory_utilization on a GPU).
"""
from __future__ import annotations

import math

from ..config import EngineConfig, format_bytes
from ..kernels.kv_q8 import check_head_dim
from ..model.kv_groups import KVGroups

PREFIX_CACHE_MARGIN = 0.25  # extra blocks, as a share of the live work, for cached prefixes
HOST_BYTES_PER_BLOCK = 256  # the block manager's Python bookkeeping per block (Block + free list)


def kv_cache_dtype(requested: str, checkpoint_dtype: str, head_dim: int, backend) -> str:
    """The pool's element type: as requested, or for "auto" the checkpoint's own
    precision as near as the pool holds it (float16 for float16 and bfloat16 folders
    and for GGUF files, as llama.cpp and vLLM keep them; float32 for float32 ones).
    int8 (kv_q8.py) where the backend holds it and head_dim takes its blocks of 32."""
    if requested == "int8":
        if "int8" not in backend.kv_cache_dtypes:
            raise ValueError(f"kv_cache_dtype='int8' is not held by the {backend.name} backend "
                             f"(it holds {', '.join(backend.kv_cache_dtypes)})")
        check_head_dim(head_dim)
    if requested != "auto":
        return requested
    return "float16" if checkpoint_dtype in ("float16", "bfloat16") else "float32"


def work_blocks(config: EngineConfig, max_model_len: int, groups: KVGroups) -> int:
    """Blocks for max_num_seqs full-length sequences decoding and one full-length
    prompt's admission, plus the prefix-cache margin."""
    held = groups.blocks_held(max_model_len, config.block_size)
    admission = groups.blocks_at_admission(max_model_len, config.block_size)
    live = config.max_num_seqs * held + max(0, admission - held)
    return math.ceil(live * (1 + PREFIX_CACHE_MARGIN))


def pool_blocks(config: EngineConfig, bytes_per_block: int, max_model_len: int,
                default_memory, groups: KVGroups) -> int:
    """num_blocks, else kv_cache_memory // bytes per block, else the default pool:
    work_blocks capped by default_memory(config) bytes (asked only then)."""
    if config.num_blocks is not None:
        return config.num_blocks
    if config.kv_cache_memory is not None:
        blocks = config.kv_cache_memory // bytes_per_block
        if blocks < 1:
            raise ValueError(f"kv_cache_memory={config.kv_cache_memory} bytes holds no block "
                             f"(one block needs {bytes_per_block} bytes)")
        return blocks
    cap = default_memory(config) // bytes_per_block
    if cap < 1:
        raise ValueError(f"no memory left for a KV pool (one block needs "
                         f"{format_bytes(bytes_per_block)}): free some, or give kv_cache_memory")
    return min(work_blocks(config, max_model_len, groups), cap)


def check_fits(what: str, nbytes: int, available: int, remedy: str) -> None:
    """One-line ValueError when nbytes will not fit in the available memory."""
    if nbytes > available:
        raise ValueError(f"{what} needs {format_bytes(nbytes)}, and only "
                         f"{format_bytes(available)} is available: {remedy}")


def check_pool_fits(num_blocks: int, bytes_per_block: int, available: int) -> None:
    check_fits(f"a KV pool of {num_blocks} blocks x {format_bytes(bytes_per_block)}",
               num_blocks * (bytes_per_block + HOST_BYTES_PER_BLOCK), available,
               "lower num_blocks or kv_cache_memory")


def check_rope_fits(max_model_len: int, head_dim: int, available: int) -> None:
    """The cos and sin tables: (max_model_len, head_dim / 2) float32 each."""
    check_fits(f"RoPE tables for max_model_len={max_model_len} positions",
               max_model_len * head_dim * 4, available, "give a smaller max_model_len")
