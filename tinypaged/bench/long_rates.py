"""Rates over long prompts, measured on the engine's own thread: prefill (prompt
tokens/s until the first token) and batch-1 decode with a long prompt already in the
KV cache (peak_rss.timed_process times whole processes from outside).

Prompts are random token ids (as llama-bench's are), a fresh draw each call, so the
prefix cache never serves one from an earlier round.
"""
from __future__ import annotations

import time

import numpy as np

from .. import SamplingParams
from .rates import on_engine_thread

_draws = np.random.default_rng(0)


def random_prompt(length: int, vocab: int) -> list[int]:
    """length token ids away from the special tokens at the start of every vocabulary."""
    return _draws.integers(min(1000, vocab // 2), min(vocab, 40000), length).tolist()


def prefill_rate(llm, prompt_len: int) -> float:
    """Prompt tokens/s: one request of prompt_len tokens, until its first token."""
    ids = random_prompt(prompt_len, llm.config.vocab_size)

    def run(engine):
        engine.add_request(ids, SamplingParams(temperature=0, max_tokens=1, ignore_eos=True))
        started = time.perf_counter()
        while engine.has_unfinished():
            engine.step()
        return prompt_len / (time.perf_counter() - started)
    return on_engine_thread(llm, run)


def decode_after_prompt(llm, prompt_len: int, n_gen: int = 64) -> float:
    """Batch-1 decode tokens/s after a prompt_len-token prompt: the steps after the
    first token, each reading the whole context's KV."""
    ids = random_prompt(prompt_len, llm.config.vocab_size)

    def run(engine):
        engine.add_request(ids, SamplingParams(temperature=0, max_tokens=n_gen + 1, ignore_eos=True))
        while not any(o.outputs for o in engine.step()):  # the prefill's chunks
            pass
        tokens, started = 0, time.perf_counter()
        while engine.has_unfinished():
            tokens += sum(len(o.outputs) for o in engine.step())
        return tokens / (time.perf_counter() - started)
    return on_engine_thread(llm, run)
