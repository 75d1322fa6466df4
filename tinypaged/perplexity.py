"""Perplexity of a token sequence: exp(mean negative log-likelihood), through the paged
engine (prompt logprobs, the path users take) or the dense reference (the oracle).

Texts longer than a window are cut into consecutive windows that overlap by one
token: a new window's context starts afresh at the previous window's last token.
Both paths cut the same windows, so their figures compare.
"""
from __future__ import annotations

import numpy as np

from .kernels.reference import log_softmax
from .model.reference import ReferenceModel
from .sampling import SamplingParams

MAX_WINDOW = 2048  # tokens per window; bounds the reference's (heads, T, T) score matrices


def window_size(max_model_len: int) -> int:
    """A window is a prompt, which must leave room for one generated token."""
    return min(max_model_len - 1, MAX_WINDOW)


def windows(token_ids: list[int], window: int) -> list[list[int]]:
    if len(token_ids) < 2:
        raise ValueError(f"perplexity needs at least 2 tokens, the text has {len(token_ids)}")
    if window < 2:
        raise ValueError(f"a perplexity window of {window} tokens predicts nothing")
    return [list(token_ids[start:start + window])
            for start in range(0, len(token_ids) - 1, window - 1)]


def engine_nll(llm, token_ids: list[int]) -> np.ndarray:
    """-log p(token[i] | the tokens before it in its window), for every token but the
    first, from the engine's prompt logprobs (all windows run as one batch)."""
    chunks = windows(token_ids, window_size(llm.engine.max_model_len))
    params = SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=0)
    outputs = llm.generate(chunks, params)
    return np.array([-lp.logprob for out in outputs for lp in out.prompt_token_logprobs[1:]])


def reference_nll(model: ReferenceModel, token_ids: list[int],
                  max_model_len: int | None = None) -> np.ndarray:
    """The same figures from the dense NumPy forward pass."""
    window = window_size(max_model_len or model.cfg.max_position_embeddings)
    nll = []
    for chunk in map(np.asarray, windows(token_ids, window)):
        logits = model.forward(chunk[:-1], model.new_cache(len(chunk)))  # (n-1, V)
        logp = log_softmax(logits.astype(np.float64))
        nll.append(-logp[np.arange(len(chunk) - 1), chunk[1:]])
    return np.concatenate(nll)


def perplexity(model: ReferenceModel, token_ids: list[int]) -> float:
    """Perplexity under the dense reference."""
    return float(np.exp(reference_nll(model, token_ids).mean()))


def engine_perplexity(llm, token_ids: list[int]) -> float:
    return float(np.exp(engine_nll(llm, token_ids).mean()))
