"""Perplexity of a token sequence under a model: exp(mean negative log-likelihood)."""
from __future__ import annotations

import numpy as np

from .kernels.reference import log_softmax
from .model.reference import ReferenceModel

MAX_WINDOW = 2048  # tokens per forward pass; bounds the (heads, T, T) score matrices


def negative_log_likelihoods(model: ReferenceModel, token_ids: list[int]) -> np.ndarray:
    """-log p(token[i] | tokens before it, within its window) for every token but the first.

    Texts longer than the window are cut into consecutive windows that overlap by
    one token: a new window's context starts afresh at the previous window's last token.
    """
    if len(token_ids) < 2:
        raise ValueError(f"perplexity needs at least 2 tokens, the text has {len(token_ids)}")
    window = min(model.cfg.max_position_embeddings, MAX_WINDOW)
    ids = np.asarray(token_ids)
    nll = []
    for start in range(0, len(ids) - 1, window - 1):
        chunk = ids[start:start + window]  # overlaps the previous chunk by one token
        logits = model.forward(chunk[:-1], model.new_cache(len(chunk)))  # (n-1, V)
        logp = log_softmax(logits.astype(np.float64))
        nll.append(-logp[np.arange(len(chunk) - 1), chunk[1:]])
    return np.concatenate(nll)


def perplexity(model: ReferenceModel, token_ids: list[int]) -> float:
    return float(np.exp(negative_log_likelihoods(model, token_ids).mean()))
