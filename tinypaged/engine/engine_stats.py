"""EngineStats: the figures LLMEngine.stats() reports, kept off the hot path.

Per step it counts tokens, samples KV utilization (one look per sequence) and, at
each new peak of blocks in use, copies the live block tables (PoolPicture.take);
the picture is drawn only when someone asks for it.
"""
from __future__ import annotations

from .block_manager import BlockManager
from .block_map import PoolPicture
from .sequence import Sequence


class EngineStats:
    def __init__(self, block_manager: BlockManager, speculation=None):
        """speculation: the engine's Speculation, whose counts join the figures (None: off)."""
        self.bm, self.speculation = block_manager, speculation
        self.steps = self.prefill_tokens = self.decode_tokens = 0
        self.peak_blocks = 0
        self.peak_picture: PoolPicture | None = None  # the pool when it held the most blocks
        self.utilization_sum, self.utilization_steps = 0.0, 0

    def count_step(self, batch) -> None:
        self.steps += 1
        self.prefill_tokens += sum(n for _, n in batch.prefills)
        self.decode_tokens += len(batch.decodes)

    def note_peak(self, live: list[Sequence]) -> None:
        """Keep a picture of the pool whenever it holds more blocks than ever before
        (live: every sequence holding blocks)."""
        used = self.bm.num_blocks - self.bm.num_free_blocks
        if used > self.peak_blocks:
            self.peak_blocks = used
            self.peak_picture = PoolPicture.take(self.bm, live)

    @property
    def peak_block_map(self) -> str:
        """The pool's picture when it held the most blocks ("" before any step)."""
        return self.peak_picture.render() if self.peak_picture else ""

    def record_utilization(self, running: list[Sequence]) -> None:
        if running:
            self.utilization_sum += self.kv_utilization(running)
            self.utilization_steps += 1

    def kv_utilization(self, running: list[Sequence]) -> float:
        """Tokens stored / slots in allocated blocks (a shared block counts once).
        Only full blocks are shared, except the part-filled last block that n samples
        share from their fork until copy-on-write; so a sequence's empty slots are
        its slots past its computed tokens, counted once for samples of a fork."""
        bs, empty, seen = self.bm.block_size, 0, set()
        for seq in running:
            computed = seq.num_computed_tokens
            for table in seq.block_tables:  # one per KV group (a block released behind
                slack = len(table) * bs - computed  # a window held computed tokens only)
                if slack and seq.params.n > 1:
                    last = table[computed // bs]
                    if last in seen:  # counted with the sample it was forked from
                        slack -= bs - computed % bs
                    seen.add(last)
                empty += slack
        used = self.bm.num_blocks - self.bm.num_free_blocks
        return (used * bs - empty) / (used * bs) if used else 1.0

    def as_dict(self) -> dict:
        bm = self.bm
        cached_free = bm.num_cached_free_blocks
        return {
            "blocks_total": bm.num_blocks,
            "blocks_used": bm.num_blocks - bm.num_free_blocks,
            "blocks_cached_free": cached_free,
            "blocks_free": bm.num_free_blocks - cached_free,
            "block_size": bm.block_size,
            "prefix_cache_query_tokens": bm.prefix_query_tokens,
            "prefix_cache_hit_tokens": bm.prefix_hit_tokens,
            "prefill_tokens_computed": self.prefill_tokens,
            "decode_tokens_computed": self.decode_tokens,
            "steps": self.steps,
            "peak_blocks": self.peak_blocks,
            "kv_utilization": (self.utilization_sum / self.utilization_steps
                               if self.utilization_steps else None),
            **(self.speculation.as_dict() if self.speculation is not None else {}),
        }
