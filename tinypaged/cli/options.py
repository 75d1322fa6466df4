"""The engine options every model-running command takes: EngineConfig's fields as
command-line flags (their defaults come from the dataclass), and back."""
from __future__ import annotations

import argparse
import dataclasses
import json

from ..config import KV_CACHE_DTYPES, EngineConfig, parse_size

ENGINE_DEFAULTS = {f.name: f.default for f in dataclasses.fields(EngineConfig)}
ENGINE_OPTIONS = ("block_size", "kv_cache_memory", "max_num_seqs", "max_num_batched_tokens",
                  "max_model_len", "backend", "quantization", "kv_cache_dtype",
                  "grammar_cache_memory", "speculative_config", "chat_template", "enable_lora",
                  "max_loras", "max_lora_rank")  # plus --lora-modules, --no-prefix-caching, --no-cuda-graphs, --no-layout-cache


def parse_bytes(text: str) -> int:
    """'536870912', '512M', '2G' -> bytes (argparse type)."""
    try:
        return parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def add_engine_options(parser: argparse.ArgumentParser) -> None:
    """The engine options every model-running command takes (EngineConfig's fields)."""
    parser.add_argument("--model", help="HF model folder or GGUF file (default: the pulled "
                        "SmolLM2-135M-Instruct GGUF, Q4_1)")
    parser.add_argument("--block-size", type=int, default=ENGINE_DEFAULTS["block_size"],
                        help="tokens per KV block")
    parser.add_argument("--kv-cache-memory", type=parse_bytes,
                        default=ENGINE_DEFAULTS["kv_cache_memory"],
                        help="KV pool size, e.g. 512M (default: a share of free RAM)")
    parser.add_argument("--max-num-seqs", type=int, default=ENGINE_DEFAULTS["max_num_seqs"],
                        help="sequences in the running batch at most")
    parser.add_argument("--max-num-batched-tokens", type=int,
                        default=ENGINE_DEFAULTS["max_num_batched_tokens"],
                        help="tokens per step; longer prompts are read in chunks")
    parser.add_argument("--max-model-len", type=int, default=ENGINE_DEFAULTS["max_model_len"],
                        help="prompt + output tokens per request (default: the model's context)")
    parser.add_argument("--no-prefix-caching", action="store_true",
                        help="do not share prompt prefixes between requests")
    parser.add_argument("--quantization", choices=["q8_0", "q4_0", "q4_1"],
                        default=ENGINE_DEFAULTS["quantization"],
                        help="quantize a float model's matrices at load (kept packed)")
    parser.add_argument("--kv-cache-dtype", choices=KV_CACHE_DTYPES,
                        default=ENGINE_DEFAULTS["kv_cache_dtype"],
                        help="KV pool element type (float16: twice the tokens in the same memory; "
                        "int8: nearly four times, llama.cpp's q8_0 rows, on the CPU; "
                        "auto: float16 for GGUF files and float16/bfloat16 folders)")
    parser.add_argument("--no-cuda-graphs", action="store_true",
                        help="CUDA: launch every decode step's kernels from Python instead "
                        "of replaying recorded steps as CUDA graphs")
    parser.add_argument("--no-layout-cache", action="store_true",
                        help="CPU: prepare a GGUF's weights at every load instead of keeping "
                        "them in FILE.tinypaged-cpu beside it and mapping that")
    parser.add_argument("--grammar-cache-memory", type=parse_bytes,
                        default=ENGINE_DEFAULTS["grammar_cache_memory"],
                        help="memory the compiled grammars of structured outputs may keep, "
                        "e.g. 512M")
    parser.add_argument("--speculative-config", default=ENGINE_DEFAULTS["speculative_config"],
                        metavar="JSON",
                        help='speculative decoding, as vLLM spells it, e.g. \'{"method": "ngram", '
                        '"num_speculative_tokens": 4, "prompt_lookup_max": 4, '
                        '"prompt_lookup_min": 2}\' (greedy requests verify the proposals; '
                        'default: off)')
    parser.add_argument("--chat-template", default=ENGINE_DEFAULTS["chat_template"],
                        metavar="FILE_OR_TEMPLATE",
                        help="a Jinja chat template (a file, or the template itself) in place "
                        "of the model's; for a model that ships none (default: the model's)")
    parser.add_argument("--enable-lora", action="store_true",
                        help="LoRA adapters may be loaded while the engine runs "
                        "(/v1/load_lora_adapter); --lora-modules turns it on too")
    parser.add_argument("--lora-modules", nargs="+", type=lora_module, metavar="NAME=PATH",
                        help="PEFT LoRA adapters loaded at start, each as name=folder (or "
                        'vLLM\'s JSON, {"name": ..., "path": ...}); a request runs one by '
                        "naming it as its model")
    parser.add_argument("--max-loras", type=int, default=ENGINE_DEFAULTS["max_loras"],
                        help="LoRA adapters loaded at once")
    parser.add_argument("--max-lora-rank", type=int, default=ENGINE_DEFAULTS["max_lora_rank"],
                        help="the largest rank a LoRA adapter may have")
    parser.add_argument("--backend", choices=["auto", "cpu", "cuda"],
                        default=ENGINE_DEFAULTS["backend"],
                        help="auto: CUDA when an NVIDIA GPU is usable, else the CPU")


def lora_module(text: str) -> tuple[str, str]:
    """'name=path' or '{"name": ..., "path": ...}' -> (name, path) (argparse type)."""
    if text.lstrip().startswith("{"):
        try:
            spec = json.loads(text)
            return str(spec["name"]), str(spec["path"])
        except (ValueError, KeyError, TypeError):
            raise argparse.ArgumentTypeError(f"{text!r} is not a JSON object with a name and "
                                             f"a path") from None
    name, sep, path = text.partition("=")
    if not sep or not name or not path:
        raise argparse.ArgumentTypeError(f"{text!r} is not name=path")
    return name, path


def engine_options(args) -> dict:
    options = {name: getattr(args, name) for name in ENGINE_OPTIONS}
    if args.lora_modules:
        options["lora_modules"] = dict(args.lora_modules)
    return {**options, "enable_prefix_caching": not args.no_prefix_caching,
            "cuda_graphs": False if args.no_cuda_graphs else ENGINE_DEFAULTS["cuda_graphs"],
            "layout_cache": not args.no_layout_cache}
