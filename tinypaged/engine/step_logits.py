"""Drawing a step's tokens from what the backend kept of its logits
(batch/step_logits.py): from candidates where the backend found them, else from
whole rows.

Drawing from candidates gives the token the whole row gives, bit for bit: the
sampler keeps exactly the top-k tokens, and sees them in id order with the same
float32 weights. Only a tie at the k-th place needs the whole row (which tokens
tie), and then the row is fetched.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from ..batch.step_logits import MAX_CANDIDATES, WHOLE_ROW, StepLogits
from ..sampling import SamplingParams, sample_tokens


def candidates_needed(params: SamplingParams) -> int:
    """WHOLE_ROW, or how many of the most likely tokens a sample of params needs."""
    if (params.logprobs is not None or params.repetition_penalty != 1.0
            or params.presence_penalty or params.frequency_penalty or params.logit_bias
            or params.structured_outputs is not None or params.allowed_token_ids is not None
            or params.bad_words or params.min_tokens):
        return WHOLE_ROW
    if params.greedy:
        return 1
    if 0 < params.top_k < MAX_CANDIDATES:
        return params.top_k + 1
    return WHOLE_ROW


class NonFiniteLogits(RuntimeError):
    """A row's logits hold NaN or infinity: no token can be drawn from them."""

    def __init__(self):
        super().__init__("the model's logits are not finite (NaN or infinity) at this step: its "
                         "weights or activations overflowed or hold non-finite values")


def draw_tokens(logits: StepLogits, rows: list[int], params: list[SamplingParams],
                uniforms: list[float], histories: list[tuple],
                masks: list[np.ndarray | None] | None = None) -> list[int]:
    """sample_tokens for rows of logits, from candidates where the backend found them,
    else from whole rows (fetched together, in one call). masks[i]: row i's allowed
    tokens (a grammar's bit mask), or None. NonFiniteLogits where a row's largest
    logit is NaN or infinite (NaN propagates through the max): a token drawn from it
    would be noise, ending as an empty or garbled completion."""
    masks = masks if masks is not None else [None] * len(rows)
    tokens: list[int | None] = [None] * len(rows)
    whole = []
    for i, (row, p) in enumerate(zip(rows, params)):
        found = logits.candidates(row) if masks[i] is None else None
        if found is not None and not np.isfinite(found[0][0]):
            raise NonFiniteLogits()
        if found is None:
            whole.append(i)
        elif p.greedy:
            tokens[i] = int(found[1][0])
        else:
            token = draw_from_candidates(*found, p, uniforms[i])
            if token is None:
                whole.append(i)
            else:
                tokens[i] = token
    if whole:
        block = logits.rows([rows[i] for i in whole])
        best = np.argmax(block, axis=1)  # (the first NaN where a row holds one, as max() finds it)
        if not np.isfinite(block[np.arange(len(block)), best]).all():
            raise NonFiniteLogits()
        plain = [j for j, i in enumerate(whole)  # greedy, nothing to change: the argmax found
                 if params[i].greedy and masks[i] is None and not params[i].adjusts_logits]
        for j in plain:
            tokens[whole[j]] = int(best[j])
        rest = [j for j in range(len(whole)) if tokens[whole[j]] is None]
        if rest:  # (a copy of their rows where some rows are plain)
            picked = [whole[j] for j in rest]
            drawn = sample_tokens(block if len(rest) == len(whole) else block[rest],
                                  [params[i] for i in picked], [uniforms[i] for i in picked],
                                  [histories[i] for i in picked], [masks[i] for i in picked])
            for j, token in zip(rest, drawn):
                tokens[whole[j]] = token
    return tokens


def draw_from_candidates(values: np.ndarray, ids: np.ndarray, params: SamplingParams,
                         uniform: float) -> int | None:
    """The token sample_tokens would draw from the whole row, given its top_k + 1 most
    likely (values, ids); None when the k-th and the next tie (the whole row decides)."""
    k = params.top_k
    if len(values) > k and values[k] == values[k - 1]:
        return None
    order = np.argsort(ids[:k], kind="stable")  # the sampler walks tokens in id order
    compact = np.asarray(values[:k], dtype=np.float32)[order][None, :]  # (1, k)
    index = sample_tokens(compact, [dataclasses.replace(params, top_k=0)], [uniform])[0]
    return int(ids[:k][order][index])
