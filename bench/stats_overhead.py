"""What statistics cost while the engine runs, and the default KV pool per model.

1. A 64-prompt x 200-token greedy batch through LLM.generate (stories260K, CPU).
   The loop thread's steps run under cProfile; the report gives the share of step
   time spent in the bookkeeping that only serves statistics (the peak picture,
   KV utilization, the /metrics histograms and gauges), and the top functions.
   cProfile charges every Python call, so Python-heavy bookkeeping looks dearer
   than it is; the timer column measures the same functions without it.
2. stats() per call, through the engine loop, with the engine idle.
3. The default KV pool for stories260K and (if pulled) SmolLM2: the rule before
   issue 9 (a fifth of free RAM) against today's (the work, capped by that).

Usage: python bench/stats_overhead.py [--kv-cache-memory BYTES] [--top 12]
Prints figures; asserts nothing.
"""
from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from tinypaged import LLM, SamplingParams  # noqa: E402
from tinypaged.config import DEFAULT_KV_MEMORY_FRACTION, available_memory_bytes, format_bytes  # noqa: E402
from tinypaged.engine import engine_loop, engine_stats, loop_metrics  # noqa: E402

STORIES = os.path.join(os.path.dirname(__file__), "..", "tests", "models", "stories260K")
# the functions that exist only for statistics (class, method)
STATISTICS = [(engine_stats.EngineStats, "note_peak"),
              (engine_stats.EngineStats, "record_utilization"),
              (loop_metrics.LoopMetrics, "observe_step"), (engine_loop.EngineLoop, "_publish_state")]


def timed(totals: dict, name: str, fn):
    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            totals[name] = totals.get(name, 0.0) + time.perf_counter() - start
    return wrapper


def batch_share(llm: LLM, top: int) -> None:
    prompts = [f"Once upon a time {i}" for i in range(64)]
    params = SamplingParams(temperature=0, max_tokens=200, ignore_eos=True)
    llm.generate(prompts[:4], SamplingParams(temperature=0, max_tokens=4))  # compile, warm

    # (a) timers: perf_counter around each statistics function and around each step
    totals: dict[str, float] = {}
    originals = [(cls, name, getattr(cls, name)) for cls, name in STATISTICS]
    step = engine_loop.EngineLoop._step
    for cls, name, fn in originals:
        setattr(cls, name, timed(totals, name, fn))
    engine_loop.EngineLoop._step = timed(totals, "step", step)
    start = time.perf_counter()
    llm.generate(prompts, params)
    wall = time.perf_counter() - start
    for cls, name, fn in originals:
        setattr(cls, name, fn)

    # (b) cProfile of the loop thread's steps, over the same batch
    profile = cProfile.Profile()

    def profiled_step(self):
        profile.enable()
        try:
            step(self)
        finally:
            profile.disable()
    engine_loop.EngineLoop._step = profiled_step
    llm.generate(prompts, params)
    engine_loop.EngineLoop._step = step
    stats = pstats.Stats(profile)
    cumulative = {fn: ct for (_, _, fn), (_, _, _, ct, _) in stats.stats.items()}

    print(f"64 x 200-token batch: {wall:.2f} s, {totals['step']:.2f} s in steps "
          f"(pool: {llm.stats()['blocks_total']} blocks)")
    print(f"{'statistics function':24} {'timer':>9} {'share':>7} {'cProfile share':>15}")
    timer_sum = profile_sum = 0.0
    for _, name in STATISTICS:
        t, c = totals.get(name, 0.0), cumulative.get(name, 0.0)
        timer_sum += t
        profile_sum += c
        print(f"{name:24} {t * 1e3:7.1f}ms {100 * t / totals['step']:6.2f}% "
              f"{100 * c / stats.total_tt:14.2f}%")
    print(f"{'all statistics':24} {timer_sum * 1e3:7.1f}ms {100 * timer_sum / totals['step']:6.2f}% "
          f"{100 * profile_sum / stats.total_tt:14.2f}%")
    print(f"\ncProfile, loop thread, top {top} by own time:")
    stats.sort_stats("tottime").print_stats(top)


def stats_call_cost(llm: LLM, calls: int = 2000) -> None:
    llm.stats()
    start = time.perf_counter()
    for _ in range(calls):
        llm.stats()
    per_call = (time.perf_counter() - start) / calls
    start = time.perf_counter()
    for _ in range(calls):
        llm.engine.stats()
    engine_side = (time.perf_counter() - start) / calls
    print(f"stats(): {per_call * 1e6:.0f} us per call through the loop "
          f"({engine_side * 1e6:.1f} us of it on the engine's side)")


def default_pools() -> None:
    models = [("stories260K", STORIES)]
    from tinypaged.pull import DEFAULT_MODEL_DIR
    if os.path.isdir(DEFAULT_MODEL_DIR):
        models.append(("SmolLM2-135M", DEFAULT_MODEL_DIR))
    old_rule = available_memory_bytes() * DEFAULT_KV_MEMORY_FRACTION
    print(f"\ndefault KV pool (free RAM now: {format_bytes(available_memory_bytes())})")
    for name, path in models:
        with LLM(path, backend="cpu") as llm:
            s = llm.stats()
            per_block = s["kv_cache_bytes"] / s["blocks_total"]
            print(f"  {name:13} before: {format_bytes(old_rule)} ({int(old_rule // per_block)} blocks)"
                  f"  now: {format_bytes(s['kv_cache_bytes'])} ({s['blocks_total']} blocks, "
                  f"max_model_len {llm.max_model_len})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kv-cache-memory", type=int, help="pool size for the batch (bytes)")
    parser.add_argument("--top", type=int, default=12)
    args = parser.parse_args()
    options = {"kv_cache_memory": args.kv_cache_memory} if args.kv_cache_memory else {}
    with LLM(STORIES, backend="cpu", **options) as llm:
        batch_share(llm, args.top)
        stats_call_cost(llm)
    default_pools()


if __name__ == "__main__":
    main()
