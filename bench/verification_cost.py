"""gpu_check's speculative rows: what a verification step costs on the card.

A sequence with k proposals runs 1 + k decode rows in a recorded step (the bucket of
1 + k rows). With random weights nothing repeats, so the proposals here are forced
(k tokens a step, whatever the prompt; nearly all rejected): what is measured is the
step's seconds by its rows, against the plain step's. Speculation pays where the
tokens a verification keeps outnumber that ratio (bench/speculative.py gives them
per workload on the CPU).
"""
from __future__ import annotations

import time


def verification_costs(model_dir: str, report, tiny: bool) -> None:
    """report(name, value, unit, note) a row per proposal count: batch 1, graph mode, the
    step's microseconds and its ratio to the plain step's."""
    from numba import cuda

    from tinypaged import LLM, SamplingParams

    decoded = 4 if tiny else 48
    plain = None
    for k in ((0, 2) if tiny else (0, 1, 3, 7)):
        options = {} if k == 0 else {"speculative_config": {"method": "ngram",
                                                            "num_speculative_tokens": max(k, 1)}}
        llm = LLM(model_dir, backend="cuda", cuda_graphs=True, max_num_seqs=1,
                  kv_cache_memory=(64 << 20) if tiny else (1 << 30), **options)
        engine = llm.engine
        if k:  # k proposals every step (token 3, whatever it is)
            speculation = engine.speculation
            speculation.sizer.choose = lambda rates, plain, k=k: [k] * len(rates)
            speculation.proposer.propose_all = lambda seqs, limits: [[3] * n for n in limits]
        engine.add_request([5, 6, 7, 8] * 8, SamplingParams(temperature=0, max_tokens=decoded + 2,
                                                           ignore_eos=True))
        engine.step()  # the prompt
        engine.step()  # the first step at this bucket (recorded)
        launcher = engine.runner.model.ops.launcher
        steps, replays, start = 0, launcher.replays, time.perf_counter()
        while engine.has_unfinished():
            engine.step()
            steps += 1
        cuda.synchronize()
        seconds = (time.perf_counter() - start) / max(1, steps)
        plain = plain or seconds
        report(f"verification step, batch 1, graph, 1 + {k} rows", seconds * 1e6, "us",
               f"{seconds / plain:.2f}x the plain step; {launcher.replays - replays} of {steps} "
               f"steps replayed")
        llm.close()
