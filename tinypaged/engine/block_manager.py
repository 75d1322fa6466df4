"""BlockManager: the KV pool's bookkeeping. Owns every ref count, hash and the free list.

A physical block holds `block_size` consecutive tokens of one or more sequences
(shared blocks). A sequence's `block_table` maps its logical block i (tokens
i*block_size .. (i+1)*block_size - 1) to a physical block id.

Prefix caching: a block full of computed tokens gets a chained hash,
hash((parent block's hash, its token ids)), so equal hashes mean equal prefixes.
A freed block keeps its hash and content until the allocator reuses it; the free
list is kept in LRU order, so a system prompt stays cached between requests that
do not overlap in time.

Sliding windows: when every layer of the model attends to the last `window` tokens
only, a block wholly behind the window of a sequence's next token is never read
again; release_behind() returns it to the pool while the sequence runs (its entry
becomes RELEASED, which no kernel reads: they start at the window).
"""
from __future__ import annotations

from collections import OrderedDict

from .block_table import PAD_BLOCK
from .sequence import Sequence

RELEASED = PAD_BLOCK  # a block-table entry whose block went back behind a sliding window


class Block:
    __slots__ = ("block_id", "ref_count", "hash", "token_ids")

    def __init__(self, block_id: int):
        self.block_id = block_id
        self.ref_count = 0
        self.hash: int | None = None  # set once the block is full of computed tokens
        self.token_ids: tuple[int, ...] | None = None  # compared on a hash hit (collisions)


def blocks_for(num_tokens: int, block_size: int) -> int:
    return -(-num_tokens // block_size)


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True,
                 window: int | None = None):
        """window: the tokens every layer attends to, when all of them slide (None:
        blocks stay with their sequence to its end)."""
        self.block_size = block_size
        self.window = window
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        # ref_count == 0 blocks; the front is evicted first
        self.free_list: OrderedDict[int, None] = OrderedDict((i, None) for i in range(num_blocks))
        self.cached: dict[int, int] = {}  # hash -> block id holding that prefix block
        self.num_cached_free_blocks = 0  # free blocks still findable in the prefix cache
        self.prefix_query_tokens = 0  # prompt tokens looked up in the prefix cache
        self.prefix_hit_tokens = 0  # of those, found

    # -- counts --------------------------------------------------------------
    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_list)

    def cached_free_block_ids(self) -> list[int]:
        """The free blocks whose content is still findable (a walk over the free list;
        num_cached_free_blocks counts them at no cost)."""
        return [b for b in self.free_list if self._is_cached(self.blocks[b])]

    def _is_cached(self, block: Block) -> bool:
        return block.hash is not None and self.cached.get(block.hash) == block.block_id

    # -- allocation ----------------------------------------------------------
    def _take_free_block(self) -> int:
        block_id, _ = self.free_list.popitem(last=False)
        block = self.blocks[block_id]
        if self._is_cached(block):  # evict its prefix-cache entry
            del self.cached[block.hash]
            self.num_cached_free_blocks -= 1
        block.hash, block.token_ids, block.ref_count = None, None, 1
        return block_id

    def _prefix_hits(self, seq: Sequence) -> list[int]:
        """Cached blocks of seq's longest cached prefix of full blocks. The block
        holding the last token is never taken: that token must be computed so
        that its logits exist. A sequence that asks for prompt logprobs computes its
        whole prompt (cached tokens would have no logits)."""
        if not self.enable_prefix_caching or seq.params.prompt_logprobs is not None:
            return []
        hits, parent, bs = [], None, self.block_size
        for i in range((len(seq) - 1) // bs):
            tokens = tuple(seq.token_ids[i * bs:(i + 1) * bs])
            h = hash((parent, tokens))
            block_id = self.cached.get(h)
            if block_id is None or self.blocks[block_id].token_ids != tokens:
                break
            hits.append(block_id)
            parent = h
        return hits

    def cached_prefix_len(self, seq: Sequence) -> int:
        """Tokens of seq that allocate() would find in the prefix cache."""
        return len(self._prefix_hits(seq)) * self.block_size

    def can_allocate(self, seq: Sequence) -> bool:
        hits = self._prefix_hits(seq)
        revived = sum(1 for b in hits if self.blocks[b].ref_count == 0)  # leave the free list too
        return blocks_for(len(seq), self.block_size) - len(hits) + revived <= len(self.free_list)

    def allocate(self, seq: Sequence) -> None:
        """Blocks for all of seq's tokens: prefix-cache hits first, then fresh ones."""
        assert not seq.block_table, "sequence already holds blocks"
        hits = self._prefix_hits(seq)
        for block_id in hits:
            block = self.blocks[block_id]
            if block.ref_count == 0:  # revived from the free list
                del self.free_list[block_id]
                self.num_cached_free_blocks -= 1
            block.ref_count += 1
            seq.block_table.append(block_id)
        for _ in range(blocks_for(len(seq), self.block_size) - len(hits)):
            seq.block_table.append(self._take_free_block())
        seq.num_computed_tokens = seq.num_cached_tokens = len(hits) * self.block_size
        if self.enable_prefix_caching:
            self.prefix_query_tokens += len(seq)
            self.prefix_hit_tokens += seq.num_cached_tokens

    def can_append(self, seq: Sequence) -> bool:
        """Whether a slot for seq's newest token can be had (needs at most one block)."""
        return self._needs_block(seq) is False or len(self.free_list) >= 1

    def _needs_block(self, seq: Sequence) -> bool | None:
        """True: a new block; None: a copy of a shared last block; False: nothing."""
        if len(seq) > len(seq.block_table) * self.block_size:
            return True
        last = self.blocks[seq.block_table[(len(seq) - 1) // self.block_size]]
        return None if last.ref_count > 1 else False

    def append_slot(self, seq: Sequence) -> tuple[int, int] | None:
        """Make the slot of seq's newest token writable. Returns (src, dst) when the
        block holding it was shared and had to be copied (copy-on-write)."""
        need = self._needs_block(seq)
        if need is True:
            seq.block_table.append(self._take_free_block())
            return None
        if need is None:
            index = (len(seq) - 1) // self.block_size
            src = seq.block_table[index]
            self.blocks[src].ref_count -= 1  # stays >= 1: it was shared
            dst = self._take_free_block()
            seq.block_table[index] = dst
            return src, dst
        return None

    def fork(self, parent: Sequence, child: Sequence) -> None:
        """child shares all of parent's blocks."""
        child.block_table = list(parent.block_table)
        child.released_hash = parent.released_hash
        for block_id in child.block_table:
            if block_id != RELEASED:
                self.blocks[block_id].ref_count += 1

    def free(self, seq: Sequence) -> None:
        """Return seq's blocks. Cached blocks keep hash and content, and go to the back of
        the LRU list (tail of the chain first, so prefixes outlive their continuations);
        uncached ones go to the front, to be reused first."""
        for block_id in reversed(seq.block_table):
            self._drop(block_id)
        seq.block_table = []
        seq.num_computed_tokens = 0
        seq.released_hash = None

    def _drop(self, block_id: int) -> None:
        """One holder less for block_id; at none it joins the free list."""
        if block_id == RELEASED:
            return
        block = self.blocks[block_id]
        block.ref_count -= 1
        assert block.ref_count >= 0
        if block.ref_count == 0:
            self.free_list[block_id] = None
            if self._is_cached(block):
                self.num_cached_free_blocks += 1
            else:
                self.free_list.move_to_end(block_id, last=False)

    def release_behind(self, seq: Sequence) -> int:
        """With a window, return the blocks wholly behind the window of seq's next token
        (position num_computed_tokens sees keys from num_computed_tokens - window + 1 on).
        Returns how many blocks it released."""
        if self.window is None:
            return 0
        first_key = seq.num_computed_tokens - self.window + 1
        released = 0
        for i in range(max(0, first_key) // self.block_size):
            block_id = seq.block_table[i]
            if block_id == RELEASED:
                continue
            seq.released_hash = self.blocks[block_id].hash  # the chain's link to what follows
            self._drop(block_id)
            seq.block_table[i] = RELEASED
            released += 1
        return released

    # -- prefix caching --------------------------------------------------------
    def register_full_blocks(self, seq: Sequence, num_tokens: int) -> None:
        """Hash the blocks filled by seq's first num_tokens tokens that are not hashed yet.

        The scheduler calls this for the tokens it schedules, before they are computed:
        they are computed in this step's forward pass, whose K/V writes precede its
        attention in every layer, so a request admitted later in the same step may
        already share them."""
        if not self.enable_prefix_caching:
            return
        bs = self.block_size
        for i in range(num_tokens // bs):
            block = self.blocks[seq.block_table[i]]
            if block.hash is not None:
                continue
            before = seq.block_table[i - 1] if i else None
            parent = None if before is None else \
                seq.released_hash if before == RELEASED else self.blocks[before].hash
            block.token_ids = tuple(seq.token_ids[i * bs:(i + 1) * bs])
            block.hash = hash((parent, block.token_ids))
            self.cached.setdefault(block.hash, block.block_id)  # first copy wins

    def forget_uncomputed(self, seq: Sequence) -> None:
        """Drop the cache entries of seq's blocks past its computed tokens: they were
        registered when scheduled, and the step that was to fill them failed."""
        bs = self.block_size
        for block_id in seq.block_table[seq.num_computed_tokens // bs:]:
            if block_id == RELEASED:
                continue
            block = self.blocks[block_id]
            if self._is_cached(block):
                del self.cached[block.hash]
            block.hash, block.token_ids = None, None

    # -- checking ------------------------------------------------------------
    def check_invariants(self, live: list[Sequence]) -> None:
        """Every invariant of the pool, given all sequences that hold blocks (for tests)."""
        holders = [0] * self.num_blocks
        for seq in live:
            for block_id in seq.block_table:
                if block_id != RELEASED:
                    holders[block_id] += 1
        for block in self.blocks:
            assert block.ref_count >= 0, f"block {block.block_id}: negative ref count"
            assert block.ref_count == holders[block.block_id], \
                f"block {block.block_id}: ref {block.ref_count} != {holders[block.block_id]} holders"
            assert (block.ref_count == 0) == (block.block_id in self.free_list), \
                f"block {block.block_id}: free list and ref count disagree"
        for h, block_id in self.cached.items():
            assert self.blocks[block_id].hash == h, f"cache entry for block {block_id} is stale"
        assert self.num_cached_free_blocks == len(self.cached_free_block_ids()), \
            "cached free block count drifted"
