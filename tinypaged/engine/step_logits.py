"""What sampling needs of each row of a step's logits, and drawing from it.

A step's logits are (R, vocab): at batch 64 and a 49k vocabulary, 12.6 MB, which a
GPU would copy back every step. Most rows need far less: a greedy sample needs the
argmax, a top-k sample the k most likely tokens (plus one, to see a tie at the
k-th), and a chunk part-way through its prompt nothing at all. The engine says
per row what it needs (needs_of); the backend leaves the logits where they are
and hands over a StepLogits that holds just that (on the GPU: whole rows copied
only where needed, candidates found on the device; on the host: the array).

Drawing from candidates gives the token the whole row gives, bit for bit: the
sampler keeps exactly the top-k tokens, and sees them in id order with the same
float32 weights. Only a tie at the k-th place needs the whole row (which tokens
tie), and then the row is fetched.
"""
from __future__ import annotations

import dataclasses
from typing import Protocol

import numpy as np

from ..sampling import SamplingParams, sample_tokens

NOT_NEEDED = 0  # a chunk part-way through its prompt: no sample, no logprobs
WHOLE_ROW = -1  # logprobs, penalties, a bias, a grammar, or sampling without a small top-k
MAX_CANDIDATES = 65  # top_k up to 64, plus one to see a tie


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


class StepLogits(Protocol):
    def rows(self, rows: list[int]) -> np.ndarray:
        """Whole rows (len(rows), vocab) as float32 on the host."""

    def candidates(self, row: int) -> tuple[np.ndarray, np.ndarray] | None:
        """(values, token ids) of the row's most likely tokens, by value descending
        then id ascending (np.argmax's tie rule); None where only whole rows exist."""


class HostLogits:
    """Logits already on the host (the CPU backend): whole rows, no candidates."""

    def __init__(self, logits: np.ndarray):
        self.logits = logits

    def rows(self, rows: list[int]) -> np.ndarray:
        return self.logits if rows == list(range(len(self.logits))) else self.logits[rows]

    def candidates(self, row: int) -> None:
        return None

    def __len__(self) -> int:
        return len(self.logits)


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
        if not np.isfinite(block.max(axis=1)).all():
            raise NonFiniteLogits()
        drawn = sample_tokens(block, [params[i] for i in whole],
                              [uniforms[i] for i in whole], [histories[i] for i in whole],
                              [masks[i] for i in whole])
        for i, token in zip(whole, drawn):
            tokens[i] = token
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
