"""LoRA adapters' cost in decode: 32 concurrent requests, 8 on each of 4 adapters (rank
16 on all seven products of every layer), against the same 32 on the base alone, on
one engine, in short runs alternated pair by pair (this VM's rate moves by a fifth
between minutes: a pair's ratio is read, the median of the pairs printed). The
adapters are random PEFT folders written under weights/derived/lora-bench/.

    python bench/lora.py [--model GGUF] [--rank 16] [--targets all|qv] [--lora-dtype auto]
                         [--pairs 8] [--tokens 24]
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np
from safetensors.numpy import save_file

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from tinypaged import LLM, SamplingParams  # noqa: E402
from tinypaged.bench.rates import commit_kv_pool, engine_decode_rate, on_engine_thread  # noqa: E402
from tinypaged.model.lora_adapter import ATTENTION_MODULES, MLP_MODULES, product_shape  # noqa: E402
from tinypaged.model.loading import load_model  # noqa: E402

ADAPTERS = 4
TARGETS = {"all": ATTENTION_MODULES + MLP_MODULES, "qv": ("q_proj", "v_proj")}


def write_adapter(folder: str, cfg, rank: int, seed: int, modules: tuple) -> None:
    """A random PEFT adapter on `modules` of every layer."""
    os.makedirs(folder, exist_ok=True)
    rng = np.random.default_rng(seed)
    tensors = {}
    for layer in range(cfg.num_hidden_layers):
        for module in modules:
            out, inner = product_shape(module, cfg)
            stem = f"base_model.model.model.layers.{layer}.{'mlp' if module in MLP_MODULES else 'self_attn'}.{module}"
            tensors[stem + ".lora_A.weight"] = (rng.standard_normal((rank, inner)) / inner ** 0.5).astype(np.float32)
            tensors[stem + ".lora_B.weight"] = (rng.standard_normal((out, rank)) * 0.01).astype(np.float32)
    save_file(tensors, os.path.join(folder, "adapter_model.safetensors"))
    with open(os.path.join(folder, "adapter_config.json"), "w") as f:
        json.dump({"peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank,
                   "target_modules": list(modules)}, f)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=os.path.join(ROOT, "weights", "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--pairs", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=24)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--targets", choices=TARGETS, default="all",
                    help="all: the seven products of every layer; qv: PEFT's default for Llama")
    ap.add_argument("--lora-dtype", default="auto")
    args = ap.parse_args()
    cfg = load_model(args.model)[0]
    folders = {}
    for i in range(ADAPTERS):
        folders[f"adapter{i}"] = os.path.join(ROOT, "weights", "derived", "lora-bench",
                                              os.path.basename(args.model),
                                              f"r{args.rank}-{args.targets}-{i}")
        write_adapter(folders[f"adapter{i}"], cfg, args.rank, i, TARGETS[args.targets])
    llm = LLM(args.model, kv_cache_memory=256 << 20, max_model_len=1024, lora_modules=folders,
              max_loras=ADAPTERS, max_lora_rank=args.rank, lora_dtype=args.lora_dtype)
    commit_kv_pool(llm)  # (a page's first write would land in whichever timed run took it)
    params = SamplingParams(temperature=0, max_tokens=args.tokens, ignore_eos=True)
    runs = {"base": [None] * args.concurrency,
            "mixed": [f"adapter{i % ADAPTERS}" for i in range(args.concurrency)]}
    for loras in runs.values():  # (warm: kernels)
        on_engine_thread(llm, lambda engine: engine_decode_rate(engine, 4, params, loras[:4]))
    rates = {name: [] for name in runs}
    for pair in range(args.pairs):
        for name in (("base", "mixed") if pair % 2 == 0 else ("mixed", "base")):
            rates[name].append(on_engine_thread(
                llm, lambda engine: engine_decode_rate(engine, args.concurrency, params, runs[name])))
    ratios = np.array(rates["mixed"]) / np.array(rates["base"])
    print(f"| {os.path.basename(args.model)}, {args.concurrency} concurrent, rank {args.rank} on "
          f"{args.targets}, {llm.engine.loras.dtype} | base tokens/s | {ADAPTERS} adapters mixed "
          f"tokens/s | mixed / base |")
    print("|---|---|---|---|")
    print(f"| medians of {args.pairs} pairs | {np.median(rates['base']):.0f} | "
          f"{np.median(rates['mixed']):.0f} | **{np.median(ratios):.3f}** "
          f"(pairs {ratios.min():.3f}-{ratios.max():.3f}) |")
    llm.close()


if __name__ == "__main__":
    main()
