"""LLM: the library entry point (vLLM-like): generate, stream, chat, stats.

Every request runs through the paged engine: one preallocated KV pool, block
tables, prefix sharing and continuous batching.
"""
from __future__ import annotations

import os
import time
from typing import Iterator

from .config import EngineConfig
from .engine.llm_engine import LLMEngine
from .outputs import RequestOutput
from .pull import default_model_dir
from .sampling import SamplingParams


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
        single = isinstance(prompts, str) or (isinstance(prompts, list) and prompts
                                               and isinstance(prompts[0], int))
        prompts = [prompts] if single else list(prompts)
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

    def chat(self, messages: list[dict], params: SamplingParams | None = None) -> RequestOutput:
        return self.generate([self.chat_prompt(messages)], params)[0]

    def stats(self) -> dict:
        return self.engine.stats()
