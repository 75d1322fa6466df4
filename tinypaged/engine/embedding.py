"""Embeddings on the paged engine: prompts prefilled, never decoded, their hidden
states pooled (model/pooling.py) into one vector each; blocks freed when done.

Runs on the engine loop's thread with the engine to itself (LLM.embed's exclusive
call), as prefill chunks of at most max_num_batched_tokens tokens over the same pool,
block tables and kernels as generation. Last-token pooling reads only each prompt's
last row, so its prompts take prefix-cache hits (a shared instruction prefix is
computed once) and leave their blocks in the cache; mean and first-token pooling read
every row, so they compute every token (Sequence.every_row).
"""
from __future__ import annotations

import numpy as np

from ..model.pooling import Pooling
from ..sampling import SamplingParams
from .scheduler import ScheduledBatch
from .sequence import Sequence


class _Pooled:
    """One prompt's sequence and what its pooling has gathered so far."""

    def __init__(self, index: int, ids: list[int], pooling: Pooling):
        self.index = index
        self.seq = Sequence(f"embed-{index}", ids, SamplingParams(temperature=0, max_tokens=1))
        self.seq.every_row = pooling.mode != "last"
        self.total = None  # float64 (H,): mean's sum, or the first or last row

    def rows_wanted(self, mode: str, n: int) -> int:
        """Rows of its next chunk of n tokens the pooling reads (the metadata's logits
        rows are a chunk's last ones: the first token's chunk gives all of its)."""
        if mode == "mean" or (mode == "cls" and self.seq.num_computed_tokens == 0):
            return n
        return 1

    def take(self, mode: str, rows: np.ndarray, first_chunk: bool, last_chunk: bool) -> None:
        rows = rows.astype(np.float64)
        if mode == "mean":
            self.total = rows.sum(axis=0) + (0 if self.total is None else self.total)
        elif mode == "cls" and first_chunk:
            self.total = rows[0]
        elif mode == "last" and last_chunk:
            self.total = rows[-1]

    def vector(self, pooling: Pooling) -> np.ndarray:
        v = self.total / len(self.seq) if pooling.mode == "mean" else self.total
        if pooling.normalize:
            v = v / max(np.linalg.norm(v), 1e-12)  # (sentence-transformers' eps)
        return v.astype(np.float32)


def run_embeddings(engine, prompts: list[list[int]], pooling: Pooling,
                   head: bool = False) -> list[np.ndarray]:
    """The pooled embedding (H,) float32 of each prompt's token ids, in order; with the
    head, the last token's logits (vocab,) instead (a reranker's: LLM.score). Prompts
    enter as free blocks allow; every block goes back, on failure too."""
    assert not head or pooling.mode == "last"
    bm, runner = engine.block_manager, engine.runner
    budget = engine.config.max_num_batched_tokens
    waiting = [_Pooled(i, ids, pooling) for i, ids in enumerate(prompts)]
    live: list[_Pooled] = []
    out: list[np.ndarray | None] = [None] * len(prompts)
    try:
        while waiting or live:
            while waiting and bm.can_allocate(waiting[0].seq):
                live.append(waiting.pop(0))
                bm.allocate(live[-1].seq)
            if not live:
                raise ValueError(f"the KV pool ({bm.num_blocks} blocks) cannot hold a prompt "
                                 f"of {len(waiting[0].seq)} tokens to embed")
            chunks, left = [], budget
            for item in live:
                n = min(item.seq.num_uncomputed_tokens, left)
                if n > 0:
                    chunks.append((item, n))
                    left -= n
            batch = ScheduledBatch(prefills=[(item.seq, n) for item, n in chunks])
            rows = [item.rows_wanted(pooling.mode, n) for item, n in chunks]
            token_ids, meta = runner.prepare(batch, rows)
            if head:  # (sum(rows), vocab): copied, the step's workspace is reused
                hidden = np.array(runner.model.forward(token_ids, meta, runner.kv), np.float32)
            else:
                hidden = runner.model.hidden_states(token_ids, meta, runner.kv)  # (sum(rows), H)
            at = 0
            for (item, n), r in zip(chunks, rows):
                seq = item.seq
                first = seq.num_computed_tokens == seq.num_cached_tokens
                seq.num_computed_tokens += n
                item.take(pooling.mode, hidden[at:at + r], first, seq.num_uncomputed_tokens == 0)
                at += r
                if not seq.every_row:  # (its blocks join the prefix cache)
                    bm.register_full_blocks(seq, seq.num_computed_tokens)
            for item in [item for item in live if item.seq.num_uncomputed_tokens == 0]:
                out[item.index] = item.vector(pooling)
                bm.free(item.seq)
                live.remove(item)
    finally:
        for item in live:
            bm.forget_uncomputed(item.seq)
            bm.free(item.seq)
    return out
