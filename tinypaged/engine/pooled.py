"""Embedding requests as ordinary requests of the continuous batch: a prompt prefilled
beside whatever else runs, never decoded, its hidden states pooled (model/pooling.py)
into one vector; the request ends with its prompt, its blocks freed.

A pooled sequence's chunks ask the forward for no logits but for the final norm's
states of the rows its pooling reads (StepPlan's `hidden` rows): every row for mean
pooling, the first for the first token's, the last for the last token's. Those take
no head (a mean over a long prompt would otherwise run the vocabulary-wide product on
every row). Last-token pooling reads the prefix cache like any prompt (a shared
instruction prefix is computed once); mean and first-token pooling compute every
token (Sequence.every_row).

A reranker's prompt is such a request too (LLM.score): its last token's state, not
normalized (SCORE_POOLING), then the head over those states for the two answers'
logits (head_logits), so scoring runs beside generation as embedding does.
"""
from __future__ import annotations

import numpy as np

from ..model.pooling import Pooling

SCORE_POOLING = Pooling("last", normalize=False, source="rerank")  # the state the head reads
HEAD_ROWS = 64  # states a head product takes at once (its logits: rows x vocab float32)


class PooledState:
    """What one prompt's pooling has gathered so far."""

    def __init__(self, pooling: Pooling):
        self.pooling = pooling
        self.total = None  # float64 (H,): mean's sum, or the first or the last row
        self.vector: np.ndarray | None = None  # (H,) float32, once the prompt is done

    def rows_wanted(self, tokens: int, computed: int) -> int:
        """Rows of a chunk of `tokens` tokens, `computed` before it, that the pooling
        reads (the chunk's last ones: the first chunk's all, for the first token)."""
        mode = self.pooling.mode
        return tokens if mode == "mean" or (mode == "cls" and computed == 0) else 1

    def take(self, rows: np.ndarray, first_chunk: bool, last_chunk: bool, length: int) -> None:
        """rows (k, H): a chunk's wanted rows (a first chunk starts anew: after a
        preemption the prompt is computed again)."""
        rows = rows.astype(np.float64)
        mode = self.pooling.mode
        if first_chunk:
            self.total = None
        if mode == "mean":
            self.total = rows.sum(axis=0) + (0 if self.total is None else self.total)
        elif mode == "cls" and first_chunk:
            self.total = rows[0]
        elif mode == "last" and last_chunk:
            self.total = rows[-1]
        if last_chunk:
            v = self.total / length if mode == "mean" else self.total
            if self.pooling.normalize:
                v = v / max(np.linalg.norm(v), 1e-12)  # (sentence-transformers' eps)
            self.vector = v.astype(np.float32)


def pooled_rows(chunks) -> tuple[np.ndarray, np.ndarray] | None:
    """(rows that take the head, rows whose states a pooling reads), int32 positions in
    the step's rows (each chunk's logits rows, then its pooled ones); None when no
    chunk pools."""
    if not any(c.hidden for c in chunks):
        return None
    head, hidden, at = [], [], 0
    for c in chunks:
        head += range(at, at + c.rows)
        hidden += range(at + c.rows, at + c.rows + c.hidden)
        at += c.rows + c.hidden
    return np.array(head, np.int32), np.array(hidden, np.int32)


def take_pooled(plan, logits, hidden: np.ndarray):
    """Each pooling chunk's rows of hidden (the step's pooled rows, in order) to its
    sequence; a sequence whose prompt is done ends (its blocks go back, its request
    reports the vector). After the chunks' tokens are counted as computed. Returns
    logits (the head rows', for sampling; None where none)."""
    at = 0
    for c in plan.chunks:
        if not c.hidden:
            continue
        seq, rows = c.seq, hidden[at:at + c.hidden]
        at += c.hidden
        if seq.is_finished:
            continue
        try:
            first = seq.num_computed_tokens - c.tokens == seq.num_cached_tokens
            seq.pooled.take(rows, first, c.completes, len(seq))
            if c.completes:
                plan.outcome.finish(seq, "stop")
        except Exception as e:
            plan.outcome.fail(seq, e)
    return logits


def head_logits(model, states: np.ndarray, columns: tuple) -> np.ndarray:
    """The logits (R, len(columns)) float32 in `columns` of the vocabulary, of states
    (R, H): final-norm states (SCORE_POOLING's), through the model's head (on the engine
    loop's thread: a call between two steps)."""
    ops, out = model.ops, []
    for start in range(0, len(states), HEAD_ROWS):
        logits = model.head(ops.upload(np.ascontiguousarray(states[start:start + HEAD_ROWS], np.float32)))
        out.append(np.array(ops.to_host(logits), np.float32)[:, list(columns)])
    return np.concatenate(out)
