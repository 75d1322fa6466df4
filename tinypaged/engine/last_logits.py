"""The last token's logits of each of a batch of prompts, prefilled and never decoded
(a reranker's scores: LLM.score), on the engine loop's thread with the engine to
itself (an exclusive call: running requests finish first, new ones wait), as prefill
chunks of at most max_num_batched_tokens tokens over the same pool, block tables and
kernels as generation. Prompts take prefix-cache hits (a shared query prefix is
computed once) and leave their blocks in the cache; every block goes back, on failure
too. (Embeddings are ordinary requests of the continuous batch: pooled.py.)
"""
from __future__ import annotations

import numpy as np

from ..sampling import SamplingParams
from .scheduler import ScheduledBatch
from .sequence import Sequence


def last_logits(engine, prompts: list[list[int]]) -> list[np.ndarray]:
    """Each prompt's last token's logits (vocab,) float32, in order."""
    bm, runner = engine.block_manager, engine.runner
    budget = engine.config.max_num_batched_tokens
    waiting = [(i, Sequence(f"score-{i}", ids, SamplingParams(temperature=0, max_tokens=1)))
               for i, ids in enumerate(prompts)]
    live: list[tuple[int, Sequence]] = []
    out: list[np.ndarray | None] = [None] * len(prompts)
    try:
        while waiting or live:
            while waiting and bm.can_allocate(waiting[0][1]):
                live.append(waiting.pop(0))
                bm.allocate(live[-1][1])
            if not live:
                raise ValueError(f"the KV pool ({bm.num_blocks} blocks) cannot hold a prompt "
                                 f"of {len(waiting[0][1])} tokens")
            chunks, left = [], budget
            for index, seq in live:
                n = min(seq.num_uncomputed_tokens, left)
                if n > 0:
                    chunks.append((index, seq, n))
                    left -= n
            token_ids, meta = runner.prepare(ScheduledBatch(prefills=[(s, n) for _, s, n in chunks]))
            logits = np.array(runner.model.forward(token_ids, meta, runner.kv), np.float32)  # (chunks, vocab)
            for row, (index, seq, n) in enumerate(chunks):
                seq.num_computed_tokens += n
                bm.register_full_blocks(seq, seq.num_computed_tokens)
                if seq.num_uncomputed_tokens == 0:
                    out[index] = logits[row]
            for index, seq in [(i, s) for i, s in live if s.num_uncomputed_tokens == 0]:
                bm.free(seq)
                live.remove((index, seq))
    finally:
        for _, seq in live:
            bm.forget_uncomputed(seq)
            bm.free(seq)
    return out
