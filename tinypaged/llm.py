"""LLM: the library entry point (vLLM-like): generate, stream, chat, stats.

Every request runs through the paged engine: one preallocated KV pool, block
tables, prefix sharing and continuous batching.
"""
from __future__ import annotations

import os
import time
from typing import Iterator

from .config import EngineConfig
from .engine.beam_search import BeamSearch, BeamSearchOutput
from .engine.llm_engine import LLMEngine
from .outputs import RequestOutput
from .pull import default_model_dir
from .sampling import SamplingParams


def as_prompt_list(prompts) -> list:
    """One prompt (text or token ids) or a list of them -> a list of prompts."""
    single = isinstance(prompts, str) or (isinstance(prompts, list) and prompts
                                           and isinstance(prompts[0], int))
    return [prompts] if single else list(prompts)


class LLM:
    def __init__(self, model: str | os.PathLike | None = None, **engine_options):
        """model: a HF model folder; None = the default SmolLM2 (pulled if missing).
        engine_options: EngineConfig fields (block_size, kv_cache_memory, num_blocks,
        enable_prefix_caching, max_num_seqs, max_num_batched_tokens, max_model_len, backend)."""
        start = time.perf_counter()
        config = EngineConfig(**engine_options)  # unknown options are a TypeError
        self.model_dir = os.fspath(model) if model is not None else os.fspath(default_model_dir())
        self.engine = LLMEngine(self.model_dir, config)
        self.tokenizer = self.engine.tokenizer
        self.config = self.engine.model_config
        self.load_seconds = time.perf_counter() - start

    def chat_prompt(self, messages: list[dict]) -> str:
        return self.tokenizer.apply_chat_template(messages, add_generation_prompt=True)

    def generate(self, prompts: str | list[int] | list[str] | list[list[int]],
                 params: SamplingParams | list[SamplingParams] | None = None) -> list[RequestOutput]:
        """Run every prompt to completion, batched; outputs in prompt order.
        A bad prompt raises ValueError naming it, before anything runs."""
        prompts = as_prompt_list(prompts)
        if params is None or isinstance(params, SamplingParams):
            params = [params or SamplingParams()] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError(f"{len(params)} SamplingParams for {len(prompts)} prompts")
        ids = []
        try:
            for i, (prompt, p) in enumerate(zip(prompts, params)):
                ids.append(self.engine.add_request(prompt, p))
        except ValueError as e:
            for request_id in ids:
                self.engine.abort(request_id)
            raise ValueError(f"prompt {i}: {e}" if len(prompts) > 1 else str(e)) from None
        results: dict[str, RequestOutput] = {}
        while len(results) < len(ids):
            for out in self.engine.step():
                if out.finished:
                    results[out.request_id] = out
        return [results[i] for i in ids]

    def stream(self, prompt: str, params: SamplingParams | None = None) -> Iterator[str]:
        """Yield text deltas of one request as they are generated (never half a
        UTF-8 character, never part of a stop string). Closing the generator aborts it."""
        request_id = self.engine.add_request(prompt, params)
        sent, finished = 0, False
        try:
            while not finished:
                for out in self.engine.step():
                    if out.request_id == request_id:
                        if len(out.text) > sent:
                            yield out.text[sent:]
                            sent = len(out.text)
                        finished = out.finished
        finally:
            if not finished:
                self.engine.abort(request_id)

    def beam_search(self, prompts: str | list[int] | list[str] | list[list[int]], beam_width: int,
                    max_tokens: int = 64, length_penalty: float = 1.0,
                    ignore_eos: bool = False) -> list[BeamSearchOutput]:
        """The beam_width best continuations of each prompt by cumulative log-probability
        (ranked by cum_logprob / length ** length_penalty). Beams share blocks."""
        if not isinstance(beam_width, int) or beam_width < 1:
            raise ValueError(f"beam_width={beam_width!r} must be an integer >= 1")
        if not isinstance(max_tokens, int) or max_tokens < 1:
            raise ValueError(f"max_tokens={max_tokens!r} must be an integer >= 1")
        if self.engine.has_unfinished():
            raise ValueError("beam search runs alone: finish or abort the running requests first")
        prompts = as_prompt_list(prompts)
        ids = [self.engine.prompt_ids(p) for p in prompts]  # reject bad input first
        results = []
        for prompt, prompt_ids in zip(prompts, ids):
            budget = min(max_tokens, self.engine.max_model_len - len(prompt_ids))
            search = BeamSearch(self.engine, prompt_ids, beam_width, budget, length_penalty,
                                ignore_eos)
            while not search.done:
                search.step()
            results.append(BeamSearchOutput(prompt if isinstance(prompt, str) else None,
                                            prompt_ids, search.best(), search.peak_blocks,
                                            search.peak_unshared))
        return results

    def chat(self, messages: list[dict], params: SamplingParams | None = None) -> RequestOutput:
        return self.generate([self.chat_prompt(messages)], params)[0]

    def stats(self) -> dict:
        return self.engine.stats()

    def block_map(self, peak: bool = False) -> str:
        """A picture of the KV pool: now, or (peak=True) when it held the most blocks."""
        return self.engine.peak_block_map if peak else self.engine.block_map()
