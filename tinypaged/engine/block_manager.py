"""BlockManager: the KV pool's bookkeeping. Owns every ref count, hash and the free list.

A physical block holds `block_size` consecutive tokens of one or more sequences
(shared blocks). The model's layers form KV groups (model/kv_groups.py): one group
of every layer, or, for models that mix sliding and global layers, groups of equal
size that all draw on this one pool. A sequence holds one block table per group;
`block_tables[g][i]` is the physical block holding its tokens
i*block_size .. (i+1)*block_size - 1 for group g's layers.

Prefix caching: a block full of computed tokens is keyed by (its group, the chained
hash of the sequence's blocks up to it: hash((parent block's hash, its token ids))),
so equal keys mean equal prefixes. A first block's parent is the sequence's hash
seed: None for the base model, a LoRA adapter's load id (its K/V differ). A freed block keeps its key and content until
the allocator reuses it; the free list is kept in LRU order, so a system prompt
stays cached between requests that do not overlap in time.

Sliding windows: a group whose layers attend to the last `window` tokens never
reads a block wholly behind the window of the sequence's next token again;
release_behind() returns it to the pool while the sequence runs (its entry becomes
RELEASED, which no kernel reads: they start at the window). A prefix-cache hit
needs, in such a group, only the blocks of the window before the first token to
compute.
"""
from __future__ import annotations

from collections import OrderedDict

from ..model.kv_groups import blocks_for
from ..batch.block_table import PAD_BLOCK
from .sequence import Sequence

RELEASED = PAD_BLOCK  # a block-table entry whose block went back behind a sliding window


class Block:
    __slots__ = ("block_id", "ref_count", "hash", "token_ids")

    def __init__(self, block_id: int):
        self.block_id = block_id
        self.ref_count = 0
        self.hash: tuple[int, int] | None = None  # (group, chain hash) once full of computed tokens
        self.token_ids: tuple[int, ...] | None = None  # compared on a hash hit (collisions)


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True,
                 windows: tuple[int | None, ...] = (None,)):
        """windows: per KV group, the tokens its layers attend to (None: all of them;
        KVGroups.windows). One group with a window: every layer slides."""
        self.block_size = block_size
        self.windows = tuple(windows)
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        # ref_count == 0 blocks; the front is evicted first
        self.free_list: OrderedDict[int, None] = OrderedDict((i, None) for i in range(num_blocks))
        self.cached: dict[tuple[int, int], int] = {}  # (group, chain hash) -> block id
        self.num_cached_free_blocks = 0  # free blocks still findable in the prefix cache
        self.prefix_query_tokens = 0  # prompt tokens looked up in the prefix cache
        self.prefix_hit_tokens = 0  # of those, found

    # -- counts --------------------------------------------------------------
    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_groups(self) -> int:
        return len(self.windows)

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_list)

    def cached_free_block_ids(self) -> list[int]:
        """The free blocks whose content is still findable (a walk over the free list;
        num_cached_free_blocks counts them at no cost)."""
        return [b for b in self.free_list if self._is_cached(self.blocks[b])]

    def _is_cached(self, block: Block) -> bool:
        return block.hash is not None and self.cached.get(block.hash) == block.block_id

    def _first_needed(self, group: int, num_tokens: int) -> int:
        """The first logical block group's layers read when computing the token at
        position num_tokens (0 unless the group slides)."""
        window = self.windows[group]
        return 0 if window is None else max(0, num_tokens - window + 1) // self.block_size

    # -- allocation ----------------------------------------------------------
    def _take_free_block(self) -> int:
        block_id, _ = self.free_list.popitem(last=False)
        block = self.blocks[block_id]
        if self._is_cached(block):  # evict its prefix-cache entry
            del self.cached[block.hash]
            self.num_cached_free_blocks -= 1
        block.hash, block.token_ids, block.ref_count = None, None, 1
        return block_id

    def _chain_hashes(self, seq: Sequence, num_blocks: int) -> list[int]:
        """The chained hashes of seq's first num_blocks full blocks, kept on seq
        (its tokens never change, so each is computed once)."""
        hashes, bs = seq.block_hashes, self.block_size
        while len(hashes) < num_blocks:
            i = len(hashes)
            hashes.append(hash((hashes[-1] if i else seq.hash_seed,
                                tuple(seq.token_ids[i * bs:(i + 1) * bs]))))
        return hashes[:num_blocks]

    def _lookup(self, group: int, seq: Sequence, i: int, chain_hash: int) -> int | None:
        """The cached block holding seq's block i for group, or None."""
        block_id = self.cached.get((group, chain_hash))
        if block_id is None:
            return None
        tokens = tuple(seq.token_ids[i * self.block_size:(i + 1) * self.block_size])
        return block_id if self.blocks[block_id].token_ids == tokens else None

    def _found(self, group: int, seq: Sequence, hashes: list[int]) -> list[int | None]:
        """The cached block of each of seq's full blocks in group (None: not cached),
        up to the first miss in a global group (which needs every block)."""
        found = []
        for i, chain_hash in enumerate(hashes):
            found.append(self._lookup(group, seq, i, chain_hash))
            if found[-1] is None and self.windows[group] is None:
                return found[:-1]
        return found

    def _prefix_hits(self, seq: Sequence) -> list[list[int]]:
        """Per group, the table of seq's longest cached prefix of k full blocks: the
        cached blocks, RELEASED where a sliding group no longer needs them. A prefix
        counts only where every group holds what the first token after it reads. The
        block holding the last token is never taken: that token must be computed so
        that its logits exist. A sequence that needs every prompt row (prompt logprobs,
        a mean embedding) computes its whole prompt (cached tokens would have no rows)."""
        if not self.enable_prefix_caching or seq.every_row:
            return [[] for _ in self.windows]
        hashes = self._chain_hashes(seq, (len(seq) - 1) // self.block_size)
        found = [self._found(g, seq, hashes) for g in range(self.num_groups)]
        k = min(len(blocks) for blocks in found)  # a global group's prefix ends at its first miss
        while k > 0 and any(None in found[g][self._first_needed(g, k * self.block_size):k]
                            for g in range(self.num_groups) if self.windows[g] is not None):
            k -= 1
        tables = []
        for g in range(self.num_groups):
            first = self._first_needed(g, k * self.block_size)
            tables.append([RELEASED] * first + found[g][first:k])
        return tables

    def cached_prefix_len(self, seq: Sequence) -> int:
        """Tokens of seq that allocate() would find in the prefix cache."""
        return len(self._prefix_hits(seq)[0]) * self.block_size

    def can_allocate(self, seq: Sequence) -> bool:
        hits = self._prefix_hits(seq)
        fresh = self.num_groups * blocks_for(len(seq), self.block_size) - \
            sum(len(table) for table in hits)
        revived = sum(1 for table in hits for b in table  # they leave the free list too
                      if b != RELEASED and self.blocks[b].ref_count == 0)
        return fresh + revived <= len(self.free_list)

    def allocate(self, seq: Sequence) -> None:
        """Blocks for all of seq's tokens in every group: prefix-cache hits first, then
        fresh ones."""
        assert not seq.block_tables, "sequence already holds blocks"
        tables = self._prefix_hits(seq)
        num_cached = len(tables[0]) * self.block_size
        for block_id in (b for table in tables for b in table if b != RELEASED):
            block = self.blocks[block_id]
            if block.ref_count == 0:  # revived from the free list
                del self.free_list[block_id]
                self.num_cached_free_blocks -= 1
            block.ref_count += 1
        for table in tables:  # (after every hit left the free list: none is taken as fresh)
            while len(table) < blocks_for(len(seq), self.block_size):
                table.append(self._take_free_block())
        seq.block_tables = tables
        seq.num_computed_tokens = seq.num_cached_tokens = num_cached
        if self.enable_prefix_caching:
            self.prefix_query_tokens += len(seq)
            self.prefix_hit_tokens += num_cached

    def can_append(self, seq: Sequence) -> bool:
        """Whether a slot for seq's newest token can be had in every group (at most one
        block each)."""
        needed = sum(self._needs_block(seq, g) is not False for g in range(self.num_groups))
        return needed <= len(self.free_list)

    def _needs_block(self, seq: Sequence, group: int) -> bool | None:
        """True: a new block; None: a copy of a shared last block; False: nothing."""
        table = seq.block_tables[group]
        if len(seq) > len(table) * self.block_size:
            return True
        last = self.blocks[table[(len(seq) - 1) // self.block_size]]
        return None if last.ref_count > 1 else False

    def append_slot(self, seq: Sequence) -> list[tuple[int, int]]:
        """Make the slot of seq's newest token writable in every group. Returns the
        (src, dst) copies to make where the block holding it was shared
        (copy-on-write)."""
        copies = []
        for g, table in enumerate(seq.block_tables):
            need = self._needs_block(seq, g)
            if need is True:
                table.append(self._take_free_block())
            elif need is None:
                index = (len(seq) - 1) // self.block_size
                src = table[index]
                self.blocks[src].ref_count -= 1  # stays >= 1: it was shared
                table[index] = self._take_free_block()
                copies.append((src, table[index]))
        return copies

    def fork(self, parent: Sequence, child: Sequence) -> None:
        """child shares all of parent's blocks."""
        child.block_tables = [list(table) for table in parent.block_tables]
        child.block_hashes = list(parent.block_hashes)
        for table in child.block_tables:
            for block_id in table:
                if block_id != RELEASED:
                    self.blocks[block_id].ref_count += 1

    def free(self, seq: Sequence) -> None:
        """Return seq's blocks. Cached blocks keep key and content, and go to the back of
        the LRU list (tail of the chain first, so prefixes outlive their continuations);
        uncached ones go to the front, to be reused first."""
        for table in seq.block_tables:
            for block_id in reversed(table):
                self._drop(block_id)
        seq.block_tables = []
        seq.num_computed_tokens = 0

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

    def truncate(self, seq: Sequence, num_tokens: int) -> None:
        """Give back seq's blocks past those its first num_tokens tokens need (rejected
        proposals' slots: speculation.py). They were never keyed: no cache entry goes."""
        keep = blocks_for(num_tokens, self.block_size)
        for table in seq.block_tables:
            while len(table) > keep:
                self._drop(table.pop())

    def release_behind(self, seq: Sequence) -> int:
        """In each sliding group, return the blocks wholly behind the window of seq's
        next token (position num_computed_tokens sees keys from
        num_computed_tokens - window + 1 on). Returns how many blocks it released."""
        released = 0
        for g, table in enumerate(seq.block_tables):
            for i in range(self._first_needed(g, seq.num_computed_tokens)):
                if table[i] != RELEASED:
                    self._drop(table[i])
                    table[i] = RELEASED
                    released += 1
        return released

    # -- prefix caching --------------------------------------------------------
    def register_full_blocks(self, seq: Sequence, num_tokens: int) -> None:
        """Key the blocks filled by seq's first num_tokens tokens that have no key yet.

        The scheduler calls this for the tokens it schedules, before they are computed:
        they are computed in this step's forward pass, whose K/V writes precede its
        attention in every layer, so a request admitted later in the same step may
        already share them."""
        if not self.enable_prefix_caching:
            return
        bs = self.block_size
        hashes = self._chain_hashes(seq, num_tokens // bs)
        for g, table in enumerate(seq.block_tables):
            for i, chain_hash in enumerate(hashes):
                if table[i] == RELEASED:
                    continue
                block = self.blocks[table[i]]
                if block.hash is not None:
                    continue
                block.token_ids = tuple(seq.token_ids[i * bs:(i + 1) * bs])
                block.hash = (g, chain_hash)
                self.cached.setdefault(block.hash, block.block_id)  # first copy wins

    def forget_uncomputed(self, seq: Sequence) -> None:
        """Drop the cache entries of seq's blocks past its computed tokens: they were
        registered when scheduled, and the step that was to fill them failed."""
        for table in seq.block_tables:
            for block_id in table[seq.num_computed_tokens // self.block_size:]:
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
            assert len(seq.block_tables) == self.num_groups, \
                f"sequence {seq.seq_id}: {len(seq.block_tables)} tables for {self.num_groups} groups"
            for table in seq.block_tables:
                for block_id in table:
                    if block_id != RELEASED:
                        holders[block_id] += 1
        for block in self.blocks:
            assert block.ref_count >= 0, f"block {block.block_id}: negative ref count"
            assert block.ref_count == holders[block.block_id], \
                f"block {block.block_id}: ref {block.ref_count} != {holders[block.block_id]} holders"
            assert (block.ref_count == 0) == (block.block_id in self.free_list), \
                f"block {block.block_id}: free list and ref count disagree"
        for key, block_id in self.cached.items():
            assert self.blocks[block_id].hash == key, f"cache entry for block {block_id} is stale"
        assert self.num_cached_free_blocks == len(self.cached_free_block_ids()), \
            "cached free block count drifted"
