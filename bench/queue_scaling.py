"""What a long queue costs the engine loop (issue 18, A1): per added request, per step,
per abort, with 10 to 10,000 requests waiting behind a full running batch.

stories260K on the CPU, max_num_seqs=8: eight requests decode (one token a step,
thousands of tokens each) while N more wait. Measured through the public API only,
so the same script measures an older checkout:
- submit: seconds to queue N requests (llm.submit) until the loop has taken them all;
- step: milliseconds per engine step while they wait (steps counted over ~2 s);
- abort: seconds for llm.abort_all() until the queue is empty and every block free.
A loop whose bookkeeping scans the queue shows step time growing with N; a flat
column is the bar. Prints figures; asserts nothing.

Usage: python bench/queue_scaling.py [--sizes 10,100,1000,10000] [--seconds 2]
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from tinypaged import LLM, SamplingParams  # noqa: E402

STORIES = os.path.join(os.path.dirname(__file__), "..", "tests", "models", "stories260K")
RUNNING = 8


def settle(llm: LLM, condition, what: str, timeout: float = 600.0) -> float:
    """Seconds until condition() holds (polled: this is a bench, not a test)."""
    start = time.perf_counter()
    while not condition():
        if time.perf_counter() - start > timeout:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.002)
    return time.perf_counter() - start


def measure(n_waiting: int, seconds: float) -> tuple[float, float, float]:
    llm = LLM(STORIES, backend="cpu", max_num_seqs=RUNNING, kv_cache_memory=64 << 20)
    try:
        llm.generate("Once upon a time", SamplingParams(temperature=0, max_tokens=4))  # warm
        long = SamplingParams(temperature=0, max_tokens=100_000 // 256, ignore_eos=True)
        prompts = [[1, 5 + i % 200] for i in range(RUNNING + n_waiting)]
        start = time.perf_counter()
        handles = [llm.submit(p, long) for p in prompts]
        settle(llm, lambda: llm.num_waiting == n_waiting, "the queue")
        submit = time.perf_counter() - start
        steps_before, t0 = llm.stats()["steps"], time.perf_counter()
        time.sleep(seconds)
        steps, elapsed = llm.stats()["steps"] - steps_before, time.perf_counter() - t0
        start = time.perf_counter()
        llm.abort_all()
        settle(llm, lambda: llm.num_waiting == 0 and llm.stats()["blocks_used"] == 0
               and llm.metrics().running == 0, "the aborts")
        abort = time.perf_counter() - start
        del handles
        return submit, elapsed / max(steps, 1) * 1e3, abort
    finally:
        llm.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="10,100,1000,10000")
    parser.add_argument("--seconds", type=float, default=2.0)
    args = parser.parse_args()
    print(f"{'waiting':>8} {'submit s':>9} {'us/add':>8} {'ms/step':>8} {'abort s':>8} {'us/abort':>9}")
    for n in (int(s) for s in args.sizes.split(",")):
        submit, step_ms, abort = measure(n, args.seconds)
        total = n + RUNNING
        print(f"{n:>8} {submit:>9.3f} {submit / total * 1e6:>8.1f} {step_ms:>8.3f} "
              f"{abort:>8.3f} {abort / total * 1e6:>9.1f}", flush=True)


if __name__ == "__main__":
    main()
