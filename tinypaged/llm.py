"""LLM: the library entry point (load a model folder, generate, stream, chat).

For now generation runs request by request on the dense reference model; the
paged engine (block pool, prefix sharing, continuous batching) replaces that
path behind the same API.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Iterator

import numpy as np

from .model.reference import ReferenceModel
from .model.weights import load_model
from .pull import default_model_dir
from .sampling import SamplingParams, sample
from .tokenizer import Tokenizer


@dataclass(slots=True)
class RequestOutput:
    prompt: str
    prompt_token_ids: list[int]
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None  # "stop" (EOS / stop token) or "length"


class LLM:
    def __init__(self, model: str | os.PathLike | None = None):
        """model: a HF model folder; None = the default SmolLM2 (pulled if missing)."""
        start = time.perf_counter()
        self.model_dir = os.fspath(model) if model is not None else os.fspath(default_model_dir())
        self.config, weights = load_model(self.model_dir)
        self.tokenizer = Tokenizer(self.model_dir)
        self.model = ReferenceModel(self.config, weights)
        self.eos_token_ids = set(self.config.eos_token_ids)
        if self.tokenizer.eos_token_id is not None:
            self.eos_token_ids.add(self.tokenizer.eos_token_id)
        self.load_seconds = time.perf_counter() - start

    # -- prompts -------------------------------------------------------------
    def encode_prompt(self, prompt: str) -> list[int]:
        if not isinstance(prompt, str) or not prompt:
            raise ValueError("prompt is empty: give at least one character of text")
        ids = self.tokenizer.encode(prompt)
        context = self.config.max_position_embeddings
        if len(ids) >= context:
            raise ValueError(f"prompt has {len(ids)} tokens; the model's context is {context} "
                             f"tokens, leaving no room to generate")
        return ids

    def chat_prompt(self, messages: list[dict]) -> str:
        return self.tokenizer.apply_chat_template(messages, add_generation_prompt=True)

    # -- generation ----------------------------------------------------------
    def _generate_ids(self, prompt_ids: list[int], params: SamplingParams,
                      out: RequestOutput) -> Iterator[int]:
        """Yield sampled token ids; sets out.finish_reason when it stops."""
        rng = np.random.default_rng(params.seed)
        budget = min(params.max_tokens, self.config.max_position_embeddings - len(prompt_ids))
        stop_ids = set(params.stop_token_ids) | (set() if params.ignore_eos else self.eos_token_ids)
        cache = self.model.new_cache(len(prompt_ids) + budget)
        logits = self.model.forward(prompt_ids, cache, all_logits=False)[-1]
        for _ in range(budget):
            token = sample(logits, params, rng)
            if token in stop_ids:
                out.finish_reason = "stop"
                return
            yield token
            logits = self.model.forward([token], cache)[-1]
        out.finish_reason = "length"

    def _run(self, prompt: str, params: SamplingParams) -> Iterator[tuple[RequestOutput, str]]:
        """Yield (output so far, text delta) after each token, then the final flush."""
        out = RequestOutput(prompt, self.encode_prompt(prompt))
        detok = self.tokenizer.detokenizer()
        for token in self._generate_ids(out.prompt_token_ids, params, out):
            out.token_ids.append(token)
            delta = detok.push(token)
            out.text += delta
            if delta:
                yield out, delta
        delta = detok.flush()
        out.text += delta
        yield out, delta

    def generate(self, prompts: str | list[str],
                 params: SamplingParams | None = None) -> list[RequestOutput]:
        params = params or SamplingParams()
        prompts = [prompts] if isinstance(prompts, str) else list(prompts)
        for p in prompts:  # reject bad input before doing any work
            self.encode_prompt(p)
        results = []
        for p in prompts:
            for out, _ in self._run(p, params):
                pass
            results.append(out)
        return results

    def stream(self, prompt: str, params: SamplingParams | None = None) -> Iterator[str]:
        """Yield text deltas as they are generated (never half a UTF-8 character)."""
        for _, delta in self._run(prompt, params or SamplingParams()):
            if delta:
                yield delta

    def chat(self, messages: list[dict], params: SamplingParams | None = None) -> RequestOutput:
        return self.generate([self.chat_prompt(messages)], params)[0]
