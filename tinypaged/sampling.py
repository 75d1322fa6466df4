"""SamplingParams (what a request asks for) and sample() (logits -> next token)."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

MAX_LOGPROBS = 20  # top alternatives per position at most (OpenAI's and vLLM's limit)


def _is_int(x) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, bool)


@dataclass(slots=True)
class SamplingParams:
    max_tokens: int = 64
    temperature: float = 1.0  # 0 = greedy
    top_k: int = 0  # 0 = no top-k cut
    top_p: float = 1.0  # 1 = no nucleus cut
    min_p: float = 0.0  # drop tokens below min_p * p(most likely); 0 = off
    repetition_penalty: float = 1.0  # > 1 discourages tokens already in prompt or output
    seed: int | None = None  # None = fresh randomness each request
    n: int = 1  # samples per prompt; they share the prompt's KV blocks
    stop: list[str] = field(default_factory=list)  # strings that end the text (not included)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    presence_penalty: float = 0.0  # OpenAI: subtracted once from every token already generated
    frequency_penalty: float = 0.0  # OpenAI: subtracted once per time a token was generated
    logit_bias: dict[int, float] = field(default_factory=dict)  # token id -> added to its logit
    logprobs: int | None = None  # per generated token: its logprob and the top k; None = off
    prompt_logprobs: int | None = None  # the same for every prompt token; None = off

    def __post_init__(self):
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        if not all(isinstance(s, str) and s for s in self.stop):
            raise ValueError(f"stop={self.stop!r} must be a list of non-empty strings")
        if not all(isinstance(t, int) and t >= 0 for t in self.stop_token_ids):
            raise ValueError(f"stop_token_ids={self.stop_token_ids!r} must be non-negative integers")
        if not isinstance(self.n, int) or self.n < 1:
            raise ValueError(f"n={self.n!r} must be an integer >= 1")
        if not 0 <= self.min_p <= 1:
            raise ValueError(f"min_p={self.min_p!r} must be in [0, 1]")
        if not self.repetition_penalty > 0:
            raise ValueError(f"repetition_penalty={self.repetition_penalty!r} must be > 0")
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise ValueError(f"max_tokens={self.max_tokens!r} must be an integer >= 1")
        if not self.temperature >= 0:  # also rejects NaN
            raise ValueError(f"temperature={self.temperature!r} must be >= 0")
        if not isinstance(self.top_k, int) or self.top_k < 0:
            raise ValueError(f"top_k={self.top_k!r} must be an integer >= 0 (0 disables it)")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p={self.top_p!r} must be in (0, 1]")
        if self.seed is not None and (not isinstance(self.seed, int) or self.seed < 0):
            raise ValueError(f"seed={self.seed!r} must be a non-negative integer or None")
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not -2 <= value <= 2:
                raise ValueError(f"{name}={value!r} must be a number in [-2, 2]")
        if not isinstance(self.logit_bias, dict) or not all(
                _is_int(t) and t >= 0 and isinstance(b, (int, float)) and math.isfinite(b)
                and -100 <= b <= 100 for t, b in self.logit_bias.items()):
            raise ValueError(f"logit_bias={self.logit_bias!r} must map token ids (integers >= 0) "
                             f"to biases in [-100, 100]")
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is not None and (not _is_int(value) or not 0 <= value <= MAX_LOGPROBS):
                raise ValueError(f"{name}={value!r} must be None or an integer in "
                                 f"[0, {MAX_LOGPROBS}]")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def apply_repetition_penalty(logits: np.ndarray, seen: np.ndarray, penalty: float) -> np.ndarray:
    """CTRL-style: for tokens in `seen`, positive logits / penalty, negative ones * penalty."""
    out = logits.astype(np.float64)
    ids = np.unique(seen)
    out[ids] = np.where(out[ids] > 0, out[ids] / penalty, out[ids] * penalty)
    return out


def adjust_logits(logits: np.ndarray, params: SamplingParams, token_ids=(),
                  num_prompt_tokens: int = 0) -> np.ndarray:
    """Logits (V,) after the repetition penalty (over prompt and output), OpenAI's
    presence and frequency penalties (over the output only), then the logit bias.
    token_ids: prompt + output so far."""
    if params.repetition_penalty != 1.0 and len(token_ids):
        logits = apply_repetition_penalty(logits, np.asarray(token_ids), params.repetition_penalty)
    output = token_ids[num_prompt_tokens:]
    if (params.presence_penalty or params.frequency_penalty) and len(output):
        counts = np.bincount(np.asarray(output), minlength=len(logits))[:len(logits)]  # (V,)
        logits = (logits.astype(np.float64) - params.frequency_penalty * counts
                  - params.presence_penalty * (counts > 0))
    if params.logit_bias:
        logits = logits.astype(np.float64)
        ids = np.fromiter(params.logit_bias.keys(), dtype=np.int64)
        logits[ids] += np.fromiter(params.logit_bias.values(), dtype=np.float64)
    return logits


def sample(logits: np.ndarray, params: SamplingParams, rng: np.random.Generator,
           token_ids=(), num_prompt_tokens: int = 0) -> int:
    """Pick the next token from logits (V,): penalties and bias (adjust_logits), then
    greedy or temperature -> top-k -> top-p -> min-p. token_ids: prompt + output so far."""
    logits = adjust_logits(logits, params, token_ids, num_prompt_tokens)
    if params.greedy:
        return int(np.argmax(logits))
    scaled = logits.astype(np.float64) / params.temperature
    if 0 < params.top_k < len(scaled):
        kth = np.partition(scaled, -params.top_k)[-params.top_k]
        scaled = np.where(scaled >= kth, scaled, -np.inf)
    probs = np.exp(scaled - scaled.max())
    probs /= probs.sum()
    if params.top_p < 1.0:
        order = np.argsort(-probs, kind="stable")
        before = np.cumsum(probs[order]) - probs[order]  # mass of strictly more likely tokens
        drop = order[before >= params.top_p]  # the smallest set reaching top_p is kept
        probs[drop] = 0.0
        probs /= probs.sum()
    if params.min_p > 0.0:
        probs[probs < params.min_p * probs.max()] = 0.0
        probs /= probs.sum()
    return int(rng.choice(len(probs), p=probs))
