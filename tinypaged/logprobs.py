"""Log-probabilities of chosen tokens and their top-k alternatives, from raw logits."""
from __future__ import annotations

import numpy as np

from .outputs import TokenLogprobs

ROWS_PER_PASS = 64  # bounds the float64 working copy: 64 x vocab


def token_logprobs(logits: np.ndarray, token_ids, k: int) -> list[TokenLogprobs]:
    """logits (n, V) -> for row i: log p(token_ids[i]) and the k most likely tokens."""
    out = []
    for start in range(0, len(logits), ROWS_PER_PASS):
        rows = np.asarray(logits[start:start + ROWS_PER_PASS], dtype=np.float64)  # (r, V)
        shifted = rows - rows.max(axis=1, keepdims=True)
        logp = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))  # (r, V)
        targets = np.asarray(token_ids[start:start + ROWS_PER_PASS], dtype=np.int64)
        chosen = logp[np.arange(len(rows)), targets]  # (r,)
        ranks = 1 + (logp > chosen[:, None]).sum(axis=1)  # (r,): 1 = the most likely
        if k > 0:
            kk = min(k, logp.shape[1])
            top = np.argpartition(-logp, kk - 1, axis=1)[:, :kk]  # (r, k), unordered
            top_logp = np.take_along_axis(logp, top, axis=1)
            order = np.argsort(-top_logp, axis=1, kind="stable")
            top, top_logp = np.take_along_axis(top, order, axis=1), np.take_along_axis(top_logp, order, axis=1)
        for i in range(len(rows)):
            alternatives = ([(int(t), float(p)) for t, p in zip(top[i], top_logp[i])]
                            if k > 0 else [])
            out.append(TokenLogprobs(int(targets[i]), float(chosen[i]), alternatives,
                                     int(ranks[i])))
    return out
