"""What a verification step costs: a batch-1 decode step with k proposals (1 + k
decode rows, speculation.py) against the plain step, on the CPU or the card.

Proposals are forced (k tokens a step, whatever the text; nearly all rejected), so a
model with random weights measures too: what is measured is the step's seconds by
its rows. Speculation pays where the tokens a verification keeps (bench/speculative.py
prints them per workload: "mean accepted", "fewer steps") outnumber that ratio. One
engine serves every k (its sizer and proposer replaced), the k alternated over rounds.

    python bench/verification_cost.py [--models llama1b,smollm2] [--ks 0,1,3,7]
        [--decoded 48] [--rounds 3] [--prompt-len 400]

gpu_check.py runs verification_costs on the card (graph mode: the recorded steps).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from tinypaged import LLM, SamplingParams  # noqa: E402


def verification_costs(model_dir: str, backend: str, report, ks=(0, 1, 3, 7), decoded: int = 48,
                       rounds: int = 1, prompt_len: int = 32) -> dict:
    """k -> median seconds of a decode step with k proposals (batch 1; on CUDA as recorded
    steps), each reported as report(name, value, unit, note) against k = 0's."""
    options = {"cuda_graphs": True} if backend == "cuda" else {"enable_prefix_caching": False}
    llm = LLM(model_dir, backend=backend, max_num_seqs=1, kv_cache_memory=256 << 20,
              speculative_config={"method": "ngram", "num_speculative_tokens": max(ks)}, **options)
    engine, speculation = llm.engine, llm.engine.speculation
    speculation.proposer.propose_all = lambda seqs, limits: [[3] * n for n in limits]
    prompt = np.random.default_rng(0).integers(3, engine.model_config.vocab_size, prompt_len).tolist()
    params = SamplingParams(temperature=0, max_tokens=decoded + 2 + max(ks), ignore_eos=True)
    times = {k: [] for k in ks}
    sync = _synchronize(backend)
    for r in range(rounds + 1):  # (round 0 warms every bucket: compiled or recorded)
        for k in (ks if r % 2 == 0 else ks[::-1]):
            speculation.sizer.choose = lambda rates, plain, k=k: [k] * len(rates)
            engine.add_request(prompt, params)
            engine.step()  # the prompt
            engine.step()  # the first step (a bucket's recording, on CUDA)
            for _ in range(decoded):
                start = time.perf_counter()
                engine.step()
                sync()
                if r:
                    times[k].append(time.perf_counter() - start)
            while engine.has_unfinished():
                engine.step()
    llm.close()
    seconds = {k: float(np.median(v)) for k, v in times.items()}
    for k in ks:
        report(f"verification step, batch 1, 1 + {k} rows ({backend})", seconds[k] * 1e3, "ms",
               f"{seconds[k] / seconds[ks[0]]:.2f}x the plain step")
    return seconds


def _synchronize(backend: str):
    if backend != "cuda":
        return lambda: None
    from numba import cuda
    return cuda.synchronize


def main():
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from speculative import MODELS
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="llama1b,smollm2")
    ap.add_argument("--ks", default="0,1,3,7")
    ap.add_argument("--decoded", type=int, default=48)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--prompt-len", type=int, default=400, help="keys of context")
    args = ap.parse_args()
    ks = tuple(int(k) for k in args.ks.split(","))
    print("| model | step | ms | against plain |\n|---|---|---|---|")
    for name in args.models.split(","):
        path = os.path.join(ROOT, MODELS.get(name, name))
        verification_costs(path, "cpu", lambda row, value, unit, note: print(
            f"| {name} | {row} | {value:.2f} | {note} |", flush=True), ks, args.decoded,
            args.rounds, args.prompt_len)


if __name__ == "__main__":
    main()
