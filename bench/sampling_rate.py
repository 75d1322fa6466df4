"""Top-p sampling's cost at 32 concurrent requests: decode tokens/s with temperature 0.8
and top-p 0.9 against greedy, on one engine, in short runs alternated pair by pair
(this VM's rate moves by a fifth between minutes: a pair's ratio is read, the median
of the pairs printed).

    python bench/sampling_rate.py [--model GGUF] [--pairs 10] [--tokens 24]
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from tinypaged import LLM, SamplingParams  # noqa: E402
from tinypaged.bench.rates import decode_rate  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=os.path.join(ROOT, "weights", "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--pairs", type=int, default=10)
    ap.add_argument("--tokens", type=int, default=24)
    ap.add_argument("--concurrency", type=int, default=32)
    args = ap.parse_args()
    llm = LLM(args.model, kv_cache_memory=256 << 20, max_model_len=1024)
    kinds = {"greedy": SamplingParams(temperature=0, max_tokens=args.tokens, ignore_eos=True),
             "top_p": SamplingParams(temperature=0.8, top_p=0.9, seed=0, max_tokens=args.tokens,
                                     ignore_eos=True)}
    for params in kinds.values():  # (warm: kernels)
        decode_rate(llm, 4, params)
    rates = {name: [] for name in kinds}
    for pair in range(args.pairs):
        for name in (("greedy", "top_p") if pair % 2 == 0 else ("top_p", "greedy")):
            rates[name].append(decode_rate(llm, args.concurrency, kinds[name]))
    ratios = np.array(rates["top_p"]) / np.array(rates["greedy"])
    print(f"| {args.concurrency} concurrent | greedy tokens/s | top-p 0.9 tokens/s | top-p / greedy |")
    print("|---|---|---|---|")
    print(f"| medians of {args.pairs} pairs | {np.median(rates['greedy']):.0f} | "
          f"{np.median(rates['top_p']):.0f} | **{np.median(ratios):.3f}** "
          f"(pairs {ratios.min():.3f}-{ratios.max():.3f}) |")


if __name__ == "__main__":
    main()
