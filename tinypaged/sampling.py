"""SamplingParams (what a request asks for) and sample() (logits -> next token)."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass(slots=True)
class SamplingParams:
    max_tokens: int = 64
    temperature: float = 1.0  # 0 = greedy
    top_k: int = 0  # 0 = no top-k cut
    top_p: float = 1.0  # 1 = no nucleus cut
    seed: int | None = None  # None = fresh randomness each request
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False

    def __post_init__(self):
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

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def sample(logits: np.ndarray, params: SamplingParams, rng: np.random.Generator) -> int:
    """Pick the next token from logits (V,): greedy, or temperature -> top-k -> top-p."""
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
    return int(rng.choice(len(probs), p=probs))
