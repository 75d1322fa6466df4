"""A text picture of the KV pool: one character per block, then each sequence's table.

Taking a picture (PoolPicture.take) only copies the live sequences' block tables,
so the engine can keep one at every new peak for the cost of a few list copies;
drawing it (render) walks the whole pool and happens only when someone asks.
"""
from __future__ import annotations

from dataclasses import dataclass

from .block_manager import BlockManager
from .sequence import Sequence

LEGEND = ("# in use, 2-9 shared by that many sequences, + by 10 or more, "
          "c cached (free, content kept), . free")
WIDTH = 64  # blocks per line


@dataclass(slots=True, frozen=True)
class PoolPicture:
    num_blocks: int
    block_size: int
    # (request, sample, tokens, blocks of each KV group)
    tables: tuple[tuple[str, int, int, tuple[tuple[int, ...], ...]], ...]
    num_cached_free: int
    cached_free: frozenset[int] | None = None  # which blocks those are; None: not recorded

    @classmethod
    def take(cls, bm: BlockManager, seqs: list[Sequence], where_cached: bool = False):
        """The pool now, held by `seqs` (every sequence holding blocks). where_cached
        also records which free blocks are cached (a walk over the free list)."""
        tables = tuple((s.request_id, s.sample_index, len(s), tuple(map(tuple, s.block_tables)))
                       for s in seqs)
        cached = frozenset(bm.cached_free_block_ids()) if where_cached else None
        return cls(bm.num_blocks, bm.block_size, tables, bm.num_cached_free_blocks, cached)

    def render(self) -> str:
        holders = [0] * self.num_blocks
        for *_, groups in self.tables:
            for b in (b for blocks in groups for b in blocks):
                if b >= 0:  # (a block released behind a sliding window is no longer held)
                    holders[b] += 1
        cached = self.cached_free or frozenset()
        chars = [_char(n, b in cached) for b, n in enumerate(holders)]
        last = max((i for i, c in enumerate(chars) if c != "."), default=-1)
        shown = chars[:max(last + 1, min(WIDTH, len(chars)))]
        lines = [f"KV pool: {self.num_blocks} blocks x {self.block_size} tokens ({LEGEND})"]
        lines += ["".join(shown[i:i + WIDTH]) for i in range(0, len(shown), WIDTH)]
        if len(shown) < len(chars):
            lines.append(f"... and {len(chars) - len(shown)} more free blocks")
        if self.cached_free is None and self.num_cached_free:
            lines.append(f"({self.num_cached_free} of the free blocks held cached prefixes; "
                         f"not placed in this picture)")
        for request_id, sample, tokens, groups in self.tables:
            where = " | ".join(" ".join("-" if b < 0 else str(b) for b in blocks)
                               for blocks in groups)  # KV groups apart; - released
            lines.append(f"request {request_id} sample {sample}: {tokens} tokens "
                         f"in blocks [{where}]")
        return "\n".join(lines)


def _char(holders: int, cached: bool) -> str:
    if holders == 0:
        return "c" if cached else "."
    if holders == 1:
        return "#"
    return str(holders) if holders < 10 else "+"


def render_block_map(bm: BlockManager, seqs: list[Sequence]) -> str:
    """The pool now, cached blocks placed: PoolPicture.take(...).render()."""
    return PoolPicture.take(bm, seqs, where_cached=True).render()
