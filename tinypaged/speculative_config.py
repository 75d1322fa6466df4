"""SpeculativeConfig: how the engine proposes tokens that one step then verifies
(vLLM's `speculative_config`, given as a dict or a JSON text), checked at start.

"ngram" (prompt lookup): the longest suffix of a sequence, prompt_lookup_max tokens
down to prompt_lookup_min, found earlier in its prompt or output proposes the
num_speculative_tokens that followed it there (engine/ngram_proposer.py).
"draft_model": a second model of the same tokenizer (`model`: a folder or GGUF file)
proposes them greedily (engine/draft_proposer.py).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, fields

from . import checks

METHODS = ("ngram", "draft_model")
MAX_SPECULATIVE_TOKENS = 32  # proposals a step at most (each one a query row to verify)
MAX_LOOKUP = 64  # the longest n-gram looked up


@dataclass(slots=True)
class SpeculativeConfig:
    method: str
    num_speculative_tokens: int  # tokens proposed for each sequence and step, at most
    prompt_lookup_max: int | None = None  # ngram: n-gram sizes tried, longest first; one
    prompt_lookup_min: int | None = None  # of them alone sets both; neither: 4 down to 2
    model: str | None = None  # draft_model: the draft's folder or GGUF file

    def __post_init__(self):
        self.method = checks.one_of("speculative_config method", self.method, METHODS)
        self.num_speculative_tokens = checks.integer(
            "speculative_config num_speculative_tokens", self.num_speculative_tokens, 1,
            MAX_SPECULATIVE_TOKENS)
        if self.method == "draft_model":
            if not isinstance(self.model, str) or not self.model:
                raise ValueError("speculative_config method 'draft_model' needs 'model': the "
                                 "draft's folder or GGUF file")
            if self.prompt_lookup_min is not None or self.prompt_lookup_max is not None:
                raise ValueError("speculative_config prompt_lookup_min/max are for method "
                                 "'ngram', not 'draft_model'")
            return
        if self.model is not None:
            raise ValueError("speculative_config 'model' is for method 'draft_model', not 'ngram'")
        low, high = self.prompt_lookup_min, self.prompt_lookup_max
        if low is None and high is None:
            low, high = 2, 4
        low, high = (high if low is None else low), (low if high is None else high)
        self.prompt_lookup_min = checks.integer("speculative_config prompt_lookup_min", low, 1,
                                                MAX_LOOKUP)
        self.prompt_lookup_max = checks.integer("speculative_config prompt_lookup_max", high,
                                                self.prompt_lookup_min, MAX_LOOKUP)

    @classmethod
    def of(cls, value) -> "SpeculativeConfig | None":
        """value as a config: None, a SpeculativeConfig, a dict of its fields or their
        JSON text. Unknown keys are an error naming them."""
        if value is None or isinstance(value, cls):
            return value
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError as e:
                raise ValueError(f"speculative_config is not valid JSON: {e}") from None
        if not isinstance(value, dict):
            raise TypeError(f"speculative_config must be a dict, got {checks.describe(value)}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(value) - known)
        if unknown:
            raise ValueError(f"speculative_config has unknown keys {unknown}; known: "
                             f"{sorted(known)}")
        for required in ("method", "num_speculative_tokens"):
            if required not in value:
                raise ValueError(f"speculative_config needs {required!r}, e.g. "
                                 '{"method": "ngram", "num_speculative_tokens": 4}')
        return cls(**value)
