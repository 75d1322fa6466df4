"""Gemma 3 270M (the Q4_K_M GGUF of `cli.py pull gemma-3-270m`) on the CPU:

1. the KV bytes one 4,096-token sequence holds while it decodes, with the local
   (sliding, window 512) layers' KV groups capped at their window, against what the
   same pool holds when every layer keeps every token (one KV group: the engine
   before the groups; figured from the same block counts);
2. decode rates, batch 1 and 32 concurrent, beside llama.cpp's on the same file
   (llama-bench and llama-batched-bench, when --llama-bench names a built one).

Usage: python bench/gemma3.py [--gguf weights/gemma-3-270m-q4_k_m.gguf]
                              [--llama-bench PATH] [--tokens 4096] [--skip-rates]
Prints figures; asserts nothing.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tinypaged import LLM, SamplingParams  # noqa: E402
from tinypaged.bench import llama_cpp_peer  # noqa: E402
from tinypaged.bench.rates import decode_rate, on_engine_thread  # noqa: E402
from tinypaged.config import format_bytes  # noqa: E402
from tinypaged.model.paged_model import PagedKVCache  # noqa: E402

NEW_TOKENS = 16  # decoded after the prompt, the last of them at position tokens - 1


def kv_bytes(gguf: str, tokens: int) -> dict:
    """Blocks in use at each decode step of one sequence whose last token sits at
    position tokens - 1, times the bytes of a block."""
    llm = LLM(gguf, backend="cpu", max_model_len=tokens + 64, max_num_seqs=1,
              kv_cache_memory=320 << 20)
    prose = (ROOT / "tests" / "data" / "prose.txt").read_text()
    ids = llm.tokenizer.encode(prose)
    prompt = (ids * (tokens // len(ids) + 1))[:tokens - NEW_TOKENS + 1]
    cfg = llm.engine.model_config
    groups = llm.engine.runner.model.kv_groups
    block_bytes = PagedKVCache.bytes_per_block(cfg, llm.engine.config.block_size,
                                               llm.engine.kv_cache_dtype)

    def work(engine):
        bm, steps = engine.block_manager, []
        schedule = engine.scheduler.schedule

        def recording_schedule():
            batch = schedule()
            steps.append((len(batch.chunks[0][0]) if batch else 0,
                          bm.num_blocks - bm.num_free_blocks, bool(batch.decodes)))
            return batch
        engine.scheduler.schedule = recording_schedule
        try:
            engine.add_request(prompt, SamplingParams(temperature=0, max_tokens=NEW_TOKENS,
                                                      ignore_eos=True))
            started = time.perf_counter()
            while engine.has_unfinished():
                engine.step()
            return steps, time.perf_counter() - started
        finally:
            engine.scheduler.schedule = schedule
    steps, seconds = on_engine_thread(llm, work)
    last_tokens, last_used, _ = [s for s in steps if s[2]][-1]
    peak_used = max(used for _, used, _ in steps)
    # every layer keeping every token: one block of all 18 layers per block_size tokens
    per_token_all_layers = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim \
        * llm.engine.runner.kv.dtype.itemsize
    full = per_token_all_layers * last_tokens
    llm.close()
    return {"tokens": last_tokens, "groups": len(groups.windows),
            "layers_per_group": groups.layers_per_group,
            "windows": [w for w in groups.windows], "block_bytes": block_bytes,
            "held_bytes": last_used * block_bytes, "full_attention_bytes": full,
            "ratio": last_used * block_bytes / full,
            "peak_bytes_during_prefill": peak_used * block_bytes, "seconds": seconds}


def rates(gguf: str, llama_bench: str | None) -> dict:
    llm = LLM(gguf, backend="cpu")
    out = {"tinypaged": {
        "batch1": decode_rate(llm, 1, SamplingParams(temperature=0, max_tokens=64, ignore_eos=True)),
        "concurrent32": decode_rate(llm, 32, SamplingParams(temperature=0, max_tokens=32,
                                                            ignore_eos=True))}}
    llm.close()
    if llama_bench:
        peer = llama_cpp_peer.run(llama_bench, Path(gguf), print)
        out["llama.cpp"] = {"batch1": peer["batch1"]["tokens_per_s"],
                            "concurrent32": peer.get("concurrent32", {}).get("tokens_per_s")}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gguf", default=str(ROOT / "weights" / "gemma-3-270m-q4_k_m.gguf"))
    parser.add_argument("--llama-bench", default=None)
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--skip-rates", action="store_true")
    args = parser.parse_args()
    print(f"machine: {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}")
    kv = kv_bytes(args.gguf, args.tokens)
    print(f"\nKV of one {kv['tokens']}-token sequence while it decodes (float32 pool, "
          f"{kv['groups']} KV groups of {kv['layers_per_group']} layers, windows {kv['windows']}):")
    print("| layout | KV bytes | vs every layer keeping every token |\n|---|---|---|")
    print(f"| every layer keeps every token | {format_bytes(kv['full_attention_bytes'])} | 100% |")
    print(f"| local groups capped at the window | {format_bytes(kv['held_bytes'])} | "
          f"{100 * kv['ratio']:.1f}% |")
    print(f"(peak while its {kv['tokens'] - NEW_TOKENS}-token prompt was admitted: "
          f"{format_bytes(kv['peak_bytes_during_prefill'])}; {kv['seconds']:.1f} s in all)")
    if args.skip_rates:
        return
    r = rates(args.gguf, args.llama_bench)
    print("\n| decode, tokens/s | batch 1 | 32 concurrent |\n|---|---|---|")
    for engine, row in r.items():
        c32 = row["concurrent32"]
        print(f"| {engine} | {row['batch1']:.1f} | {'-' if c32 is None else f'{c32:.1f}'} |")


if __name__ == "__main__":
    main()
