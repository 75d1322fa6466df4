"""EngineConfig: the knobs of the paged engine (KV pool size, block size, batching)."""
from __future__ import annotations

import math
import os
from dataclasses import dataclass

from . import checks
from .speculative_config import SpeculativeConfig

BACKENDS = ("auto", "cpu", "cuda", "reference")
KV_CACHE_DTYPES = ("auto", "float32", "float16", "int8")
DEFAULT_KV_MEMORY_FRACTION = 0.2  # of available RAM at most, when no pool size is given
QUANTIZATIONS = ("q8_0", "q4_0", "q4_1")  # what quantization= may ask for
MAX_BLOCK_SIZE = 1024  # tokens per block; larger blocks waste up to a block per sequence
LORA_DTYPES = ("auto", "float16", "float32")
MAX_LORA_RANK = 256  # the largest max_lora_rank (the CPU kernel's scratch row: cpu/lora.py)


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


def parse_size(text: str) -> int:
    """'536870912', '512M', '1.5G', '64KiB' -> bytes; ValueError for anything else."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    body = text.strip().upper().removesuffix("B").removesuffix("I")
    try:
        scale = units[body[-1]] if body and body[-1] in units else 1
        value = float(body[:-1] if scale > 1 else body)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"invalid size {text!r}: give a positive number of bytes, "
                         f"e.g. 536870912, 512M or 2G")
    return int(value * scale)


def format_bytes(n: float) -> str:
    for unit, size in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{int(n)} bytes"


@dataclass(slots=True)
class EngineConfig:
    block_size: int = 16  # tokens per KV block
    kv_cache_memory: int | str | None = None  # bytes ("512M" too) for the KV pool; None: sized
    #   for max_num_seqs x max_model_len, capped by a share of free memory (kv_pool.py)
    num_blocks: int | None = None  # pool size in blocks; overrides kv_cache_memory
    max_num_seqs: int = 64  # sequences in the running batch at most
    max_num_batched_tokens: int = 512  # tokens per step; longer prompts are prefilled in chunks
    max_model_len: int | None = None  # prompt + output tokens; None: the model's context
    enable_prefix_caching: bool = True
    backend: str = "auto"
    gpu_memory_utilization: float = 0.9  # CUDA: share of free device memory for the KV pool
    gpu_weight_dtype: str = "float16"  # CUDA: how weight matrices are stored on the device
    quantization: str | None = None  # "q8_0", "q4_0", "q4_1": quantize float matrices at load
    cuda_graphs: bool | None = None  # CUDA: replay recorded decode steps; None: on with a GPU
    kv_cache_dtype: str = "auto"  # "float16": half the bytes a token, twice the blocks;
    #   "int8": a quarter, plus a scale per 32 values (kernels/kv_q8.py);
    #   "auto": float16 for float16 / bfloat16 checkpoints and GGUF files, else float32
    layout_cache: bool = True  # CPU: keep a GGUF's prepared weights beside it
    #   (<file>.tinypaged-cpu) and map them on the next load (kernels/cpu/weight_cache.py)
    grammar_cache_memory: int | str = "512M"  # bytes the compiled grammars may hold
    #   (least recently used dropped first; structured/grammar.py)
    speculative_config: SpeculativeConfig | dict | str | None = None  # proposals verified in
    #   one step (speculative_config.py); None: off
    chat_template: str | None = None  # a chat template's file, or the template itself, in
    #   place of the model's (vLLM's --chat-template); None: the model's own
    enable_lora: bool = False  # LoRA adapters may be loaded while the engine runs
    #   (LLM.load_lora, /v1/load_lora_adapter); lora_modules turns it on too
    lora_modules: dict | None = None  # adapter name -> PEFT adapter folder, loaded at start
    max_loras: int = 4  # adapters loaded at once; each one's rows run in any batch
    max_lora_rank: int = 16  # the largest rank an adapter may have (vLLM's default)
    lora_dtype: str = "auto"  # how adapters' A and B are held: "float16" (half the bytes each
    #   step streams), "float32" (as PEFT saves them); "auto": float32 for a float32 model,
    #   else float16 (vLLM's auto: the model's dtype)

    def __post_init__(self):
        """Check every field (TypeError: wrong type, ValueError: out of range)."""
        self.block_size = checks.integer("block_size", self.block_size, 1, MAX_BLOCK_SIZE)
        if isinstance(self.kv_cache_memory, str):
            self.kv_cache_memory = parse_size(self.kv_cache_memory)
        elif self.kv_cache_memory is not None:
            self.kv_cache_memory = int(checks.number("kv_cache_memory", self.kv_cache_memory,
                                                     above=0))
        self.num_blocks = checks.optional_integer("num_blocks", self.num_blocks, 1)
        self.max_num_seqs = checks.integer("max_num_seqs", self.max_num_seqs, 1)
        self.max_num_batched_tokens = checks.integer("max_num_batched_tokens",
                                                     self.max_num_batched_tokens, 1)
        self.max_model_len = checks.optional_integer("max_model_len", self.max_model_len, 2)
        self.enable_prefix_caching = checks.boolean("enable_prefix_caching",
                                                    self.enable_prefix_caching)
        self.backend = checks.one_of("backend", self.backend, BACKENDS)
        self.gpu_memory_utilization = checks.number("gpu_memory_utilization",
                                                    self.gpu_memory_utilization, maximum=1, above=0)
        self.gpu_weight_dtype = checks.one_of("gpu_weight_dtype", self.gpu_weight_dtype,
                                              ("float16", "float32"))
        self.kv_cache_dtype = checks.one_of("kv_cache_dtype", self.kv_cache_dtype,
                                            KV_CACHE_DTYPES)
        self.layout_cache = checks.boolean("layout_cache", self.layout_cache)
        if isinstance(self.grammar_cache_memory, str):
            self.grammar_cache_memory = parse_size(self.grammar_cache_memory)
        self.grammar_cache_memory = checks.integer("grammar_cache_memory",
                                                   self.grammar_cache_memory, 0)
        if self.cuda_graphs is not None:
            self.cuda_graphs = checks.boolean("cuda_graphs", self.cuda_graphs)
        if self.quantization is not None:
            self.quantization = checks.one_of("quantization", self.quantization, QUANTIZATIONS)
        self.speculative_config = SpeculativeConfig.of(self.speculative_config)
        if self.chat_template is not None:
            self.chat_template = checks.text("chat_template", self.chat_template)
        self.enable_lora = checks.boolean("enable_lora", self.enable_lora)
        if self.lora_modules is not None:
            if not isinstance(self.lora_modules, dict):
                raise TypeError(f"lora_modules must be a dict of adapter name -> folder, got "
                                f"{type(self.lora_modules).__name__}")
            for name, path in self.lora_modules.items():
                checks.text("lora_modules' adapter name", name)
                checks.text(f"lora_modules[{name!r}]", path)
            self.enable_lora = self.enable_lora or bool(self.lora_modules)
        self.max_loras = checks.integer("max_loras", self.max_loras, 1)
        self.max_lora_rank = checks.integer("max_lora_rank", self.max_lora_rank, 1, MAX_LORA_RANK)
        self.lora_dtype = checks.one_of("lora_dtype", self.lora_dtype, LORA_DTYPES)
        if self.lora_modules and len(self.lora_modules) > self.max_loras:
            raise ValueError(f"lora_modules names {len(self.lora_modules)} adapters; max_loras "
                             f"is {self.max_loras}")
