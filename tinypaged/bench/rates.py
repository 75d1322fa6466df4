"""The bench's measuring helpers, shared by its rows: where a figure is taken (the
engine loop's own thread) and the decode rate of a batch of requests."""
from __future__ import annotations

import time

from ..sampling import SamplingParams

MAX_MODEL_LEN = 2048  # what a naive engine reserves per request
KV_BUDGET = 1 << 30  # bytes of KV cache both schemes get


def on_engine_thread(llm, work):
    """work(engine) run on the LLM's own loop thread, the engine to itself. Every
    figure is measured there, where users' requests run: numba's OpenMP layer gives
    each thread that launches parallel kernels a team of its own, and while a
    second team exists (the main thread's, or another live LLM's) every parallel
    call pays a slower wake-up: batch-1 decode fell 35% (bench/NOTES.md)."""
    return llm._loop.call(lambda: work(llm.engine), exclusive=True)


def commit_kv_pool(llm) -> None:
    """Writes every page of a CPU KV pool once, before anything is timed, as llama.cpp
    clears its cache buffer at load. The pool's numpy arrays are mapped lazily: the first
    write to a page faults it in, and on a VM whose host backs guest memory only on first
    use that costs ~13 us a page (bench/NOTES.md, 2026-12-05), which would otherwise land
    in whichever timed row first takes those blocks."""
    def touch(engine):
        for pool in (engine.runner.kv.k, engine.runner.kv.v):
            pool.fill(0)
    on_engine_thread(llm, touch)


def decode_rate(llm, concurrency: int, params: SamplingParams) -> float:
    """Tokens/s of the decode steps (sampling included) with `concurrency` requests
    running, from steps with nothing left to admit."""
    return on_engine_thread(llm, lambda engine: engine_decode_rate(engine, concurrency, params))


def engine_decode_rate(engine, concurrency: int, params: SamplingParams | list[SamplingParams],
                       loras: list | None = None) -> float:
    """params: one for every request, or one each; loras: each request's LoRA adapter
    (None: the base)."""
    for i in range(concurrency):
        prompt = f"Write a short story about a lighthouse keeper. Story number {i}."
        engine.add_prepared(engine.prepare_request(prompt, params[i] if isinstance(params, list) else params,
                                                   None if loras is None else loras[i]))
    tokens, seconds = 0, 0.0
    while engine.has_unfinished():
        decoding = engine.scheduler.num_waiting == 0
        t = time.perf_counter()
        outs = engine.step()
        if decoding:
            seconds += time.perf_counter() - t
            tokens += sum(len(o.outputs) for o in outs)
    return tokens / seconds if seconds else float("nan")
