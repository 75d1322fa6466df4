"""EngineConfig: the knobs of the paged engine (KV pool size, block size, batching)."""
from __future__ import annotations

import os
from dataclasses import dataclass

BACKENDS = ("auto", "cpu", "cuda", "reference")
DEFAULT_KV_MEMORY_FRACTION = 0.2  # of available RAM, when neither size is given


def available_memory_bytes() -> int:
    """RAM the OS can hand out now (MemAvailable), falling back to free pages."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


@dataclass(slots=True)
class EngineConfig:
    block_size: int = 16  # tokens per KV block
    kv_cache_memory: int | None = None  # bytes for the KV pool; None: a share of free RAM
    num_blocks: int | None = None  # pool size in blocks; overrides kv_cache_memory
    max_num_seqs: int = 64  # sequences in the running batch at most
    max_num_batched_tokens: int = 512  # tokens per step; longer prompts are prefilled in chunks
    max_model_len: int | None = None  # prompt + output tokens; None: the model's context
    enable_prefix_caching: bool = True
    backend: str = "auto"
    gpu_memory_utilization: float = 0.9  # CUDA: share of free device memory for the KV pool
    gpu_weight_dtype: str = "float16"  # CUDA: how weight matrices are stored on the device

    def __post_init__(self):
        if not isinstance(self.block_size, int) or self.block_size < 1:
            raise ValueError(f"block_size={self.block_size!r} must be a positive integer")
        if self.kv_cache_memory is not None and self.kv_cache_memory <= 0:
            raise ValueError(f"kv_cache_memory={self.kv_cache_memory!r} must be a positive "
                             f"number of bytes")
        if self.num_blocks is not None and (not isinstance(self.num_blocks, int)
                                            or self.num_blocks < 1):
            raise ValueError(f"num_blocks={self.num_blocks!r} must be a positive integer")
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs={self.max_num_seqs!r} must be >= 1")
        if self.max_num_batched_tokens < 1:
            raise ValueError(f"max_num_batched_tokens={self.max_num_batched_tokens!r} "
                             f"must be >= 1")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValueError(f"max_model_len={self.max_model_len!r} must be >= 2")
        if self.backend not in BACKENDS:
            raise ValueError(f"backend={self.backend!r} is not one of {BACKENDS}")
        if self.gpu_weight_dtype not in ("float16", "float32"):
            raise ValueError(f"gpu_weight_dtype={self.gpu_weight_dtype!r} must be 'float16' "
                             f"or 'float32'")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError(f"gpu_memory_utilization={self.gpu_memory_utilization!r} "
                             f"must be in (0, 1]")

    def resolve_num_blocks(self, bytes_per_block: int, default_memory) -> int:
        """Pool size in blocks: num_blocks, else kv_cache_memory (or the backend's
        default, default_memory(self), asked only then) // bytes per block."""
        if self.num_blocks is not None:
            return self.num_blocks
        memory = self.kv_cache_memory
        if memory is None:
            memory = default_memory(self)
        blocks = int(memory // bytes_per_block)
        if blocks < 1:
            raise ValueError(f"kv_cache_memory={memory} bytes holds no block "
                             f"(one block needs {bytes_per_block} bytes)")
        return blocks
