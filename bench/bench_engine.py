"""Paged engine on SmolLM2: decode throughput, prefix caching, KV utilisation.

Prints figures (and ratios against baselines measured in the same run); asserts
nothing. Usage: python bench/bench_engine.py [--model DIR] [--decode-tokens N]
"""
import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from tinypaged import LLM, SamplingParams  # noqa: E402
from tinypaged.bench.workload import INSTRUCTION, SYSTEM_TOPICS as TOPICS  # noqa: E402
from tinypaged.model.reference import ReferenceModel  # noqa: E402
from tinypaged.model.loading import load_model  # noqa: E402


def run_steps(llm, prompts, params):
    """Drive the engine; returns (decode tokens, decode seconds, first-token times, total)."""
    engine = llm.engine
    start = time.perf_counter()
    ids = [engine.add_request(p, params) for p in prompts]
    first_token, decode_tokens, decode_seconds = {}, 0, 0.0
    while engine.has_unfinished():
        prefill_waiting = engine.scheduler.num_waiting > 0
        t = time.perf_counter()
        outputs = engine.step()
        dt = time.perf_counter() - t
        if not prefill_waiting:  # a pure decode step: every running sequence adds a token
            decode_seconds += dt
            decode_tokens += sum(len(o.outputs) for o in outputs)
        for o in outputs:
            first_token.setdefault(o.request_id, time.perf_counter() - start)
    return decode_tokens, decode_seconds, [first_token[i] for i in ids], time.perf_counter() - start


def dense_decode_rate(llm, prompt_ids, n_tokens):
    """Batch-1 greedy decode tokens/s of the dense NumPy reference (the baseline)."""
    model = ReferenceModel(*load_model(llm.model_dir))
    cache = model.new_cache(len(prompt_ids) + n_tokens + 1)
    token = int(model.forward(prompt_ids, cache, all_logits=False)[-1].argmax())
    t = time.perf_counter()
    for _ in range(n_tokens):
        token = int(model.forward([token], cache)[-1].argmax())
    return n_tokens / (time.perf_counter() - t)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model")
    ap.add_argument("--decode-tokens", type=int, default=64)
    args = ap.parse_args()
    n = args.decode_tokens

    llm = LLM(args.model, kv_cache_memory=1 << 30)
    print(f"model {llm.model_dir}; KV pool {llm.stats()['blocks_total']} blocks x 16 tokens")
    warm = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    llm.generate(["warm up the kernels"] * 5, warm)  # compile / load numba caches

    params = SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)
    prompt = "Write a short story about a lighthouse keeper."
    dense = dense_decode_rate(llm, llm.tokenizer.encode(prompt), n // 2)
    print(f"\n== decode throughput ({n} tokens per request, greedy) ==")
    print(f"dense reference, batch 1: {dense:7.1f} tokens/s")
    rates = {}
    for batch in (1, 8, 32):
        prompts = [f"{prompt} Story number {i}." for i in range(batch)]
        tokens, seconds, _, total = run_steps(llm, prompts, params)
        rates[batch] = tokens / seconds
        print(f"paged engine, {batch:2d} concurrent: {rates[batch]:7.1f} tokens/s "
              f"(x{rates[batch] / dense:.2f} dense, x{rates[batch] / rates[1]:.2f} batch 1); "
              f"KV utilisation {llm.stats()['kv_utilization']:.3f} (cumulative)")
    print(f"KV utilisation averaged over these short runs: {llm.stats()['kv_utilization']:.4f}")

    print("\n== KV utilisation: 32 requests, prompts of 60-400 tokens, 128 new tokens each ==")
    rng = np.random.default_rng(0)
    words = INSTRUCTION.split()
    prompts = [f"Topic {TOPICS[i % 16]} {i}: " + " ".join(words[:int(rng.integers(40, 300))])
               for i in range(32)]
    run = LLM(args.model, kv_cache_memory=1 << 30, enable_prefix_caching=False)
    run.generate(prompts, SamplingParams(temperature=0, max_tokens=128, ignore_eos=True))
    stats = run.stats()
    lengths = [len(run.tokenizer.encode(p)) for p in prompts]
    print(f"prompt tokens {min(lengths)}-{max(lengths)}; tokens stored / slots allocated, "
          f"averaged over {stats['steps']} steps: {stats['kv_utilization']:.4f} (target >= 0.96)")

    print("\n== prefix caching: 16 chat requests, shared system prompt + 300-token instruction ==")
    chats = [llm.chat_prompt([{"role": "user", "content": f"{INSTRUCTION}Topic: {t}."}])
             for t in TOPICS]
    n_prompt = [len(llm.tokenizer.encode(c)) for c in chats]
    print(f"prompt tokens per request: {min(n_prompt)}-{max(n_prompt)}, total {sum(n_prompt)}")
    short = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    results = {}
    for caching in (False, True):
        run = LLM(args.model, kv_cache_memory=1 << 30, enable_prefix_caching=caching)
        run.generate(["warm up"], warm)
        before = run.stats()["prefill_tokens_computed"]
        _, _, ttft, total = run_steps(run, chats, short)
        computed = run.stats()["prefill_tokens_computed"] - before
        results[caching] = (computed, np.mean(ttft), max(ttft), total)
        print(f"caching {'on ' if caching else 'off'}: prefill tokens computed {computed:5d}; "
              f"time to first token mean {np.mean(ttft):.2f} s, last {max(ttft):.2f} s; "
              f"total {total:.2f} s")
    on, off = results[True], results[False]
    print(f"computed on/off = {on[0] / off[0]:.3f} (target <= 0.125); "
          f"mean TTFT x{off[1] / on[1]:.2f} faster; total x{off[3] / on[3]:.2f} faster")


if __name__ == "__main__":
    main()
