"""BlockManager: unit cases, and a hypothesis state machine that runs random
allocate / append / fork / free / preempt sequences against a model of the pool's
content (each slot holds the token whose K/V it would hold)."""
import hypothesis.strategies as st
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from tinypaged.engine.block_manager import RELEASED, BlockManager
from tinypaged.engine.sequence import Sequence
from tinypaged.sampling import SamplingParams

PARAMS = SamplingParams(temperature=0)


def seq_of(tokens):
    return Sequence("r", list(tokens), PARAMS)


def computed(bm, seq):
    seq.num_computed_tokens = len(seq)
    bm.register_full_blocks(seq, seq.num_computed_tokens)


def test_blocks_behind_a_window_are_released_and_the_hash_chain_goes_on():
    """Window 4, blocks of 2: after 7 computed tokens the next token (position 7) sees
    keys 4..7, so blocks 0 and 1 (positions 0-3) go back; the released blocks stay in
    the prefix cache, forks and frees skip the released entries, and the block filled
    next is hashed on the chain that ran through the released ones."""
    from tinypaged.engine.block_manager import RELEASED
    bm = BlockManager(num_blocks=8, block_size=2, windows=(4,))
    a = seq_of([1, 2, 3, 4, 5, 6, 7])
    bm.allocate(a)
    computed(bm, a)
    held = list(a.block_table)
    assert bm.release_behind(a) == 2
    assert a.block_table[:2] == [RELEASED, RELEASED] and a.block_table[2:] == held[2:]
    assert bm.release_behind(a) == 0  # (again: nothing more)
    bm.check_invariants([a])
    assert bm.num_cached_free_blocks == 2  # still findable by the next request
    b = a.fork(1)
    bm.fork(a, b)
    bm.check_invariants([a, b])
    a.append_token(8)
    bm.append_slot(a)
    computed(bm, a)  # block 3 = [7, 8] fills: hashed on the chain through blocks 0-2
    same = seq_of([1, 2, 3, 4, 5, 6, 7, 8, 9])
    assert bm.cached_prefix_len(same) == 8
    bm.free(b)
    bm.free(a)
    bm.check_invariants([])
    assert bm.num_free_blocks == 8


def test_lru_reuse_keeps_a_freed_prefix_until_its_blocks_are_needed():
    bm = BlockManager(num_blocks=4, block_size=2)
    a = seq_of([1, 2, 3, 4, 5])  # 3 blocks: [1 2] [3 4] [5]
    bm.allocate(a)
    computed(bm, a)
    prefix_blocks = a.block_table[:2]
    bm.free(a)
    assert bm.num_free_blocks == 4 and bm.num_cached_free_blocks == 2
    b = seq_of([1, 2, 3, 4, 9])
    bm.allocate(b)
    assert b.num_cached_tokens == 4 and b.block_table[:2] == prefix_blocks
    bm.free(b)
    c = seq_of([7, 7, 7, 7, 7, 7, 7])  # needs all 4 blocks: evicts the cached prefix
    assert bm.can_allocate(c)
    bm.allocate(c)
    assert c.num_cached_tokens == 0 and bm.cached == {}  # the old prefix was evicted
    bm.free(c)


def test_uncached_blocks_are_reused_before_cached_ones():
    bm = BlockManager(num_blocks=3, block_size=2)
    a = seq_of([1, 2, 3])  # [1 2] full and cached, [3] partial and not
    bm.allocate(a)
    computed(bm, a)
    partial = a.block_table[1]
    bm.free(a)
    b = seq_of([8])
    bm.allocate(b)
    assert b.block_table == [partial]


def test_copy_on_write_of_a_shared_partial_block():
    bm = BlockManager(num_blocks=4, block_size=4)
    parent = seq_of([1, 2, 3])
    bm.allocate(parent)
    computed(bm, parent)
    child = parent.fork(1)
    bm.fork(parent, child)
    assert bm.blocks[parent.block_table[0]].ref_count == 2
    child.append_token(9)
    [(src, dst)] = bm.append_slot(child)
    assert src == parent.block_table[0] and child.block_table == [dst]
    assert bm.blocks[src].ref_count == 1
    parent.append_token(5)
    assert bm.append_slot(parent) == []  # now the only holder: written in place
    bm.check_invariants([parent, child])


def test_kv_groups_share_one_pool_and_only_sliding_groups_release():
    """A global group and two sliding ones (window 4, blocks of 2): each sequence holds
    a table per group from the one pool; behind the window only the sliding tables
    give blocks back; a prefix hit needs every block in the global group but only
    the window's in the sliding ones (the rest enter the table as RELEASED)."""
    from tinypaged.engine.block_manager import RELEASED
    bm = BlockManager(num_blocks=20, block_size=2, windows=(None, 4, 4))
    a = seq_of([1, 2, 3, 4, 5, 6, 7])
    assert bm.can_allocate(a)
    bm.allocate(a)  # 4 blocks in each of 3 groups
    assert [len(t) for t in a.block_tables] == [4, 4, 4] and bm.num_free_blocks == 8
    assert len({b for t in a.block_tables for b in t}) == 12  # no block in two groups
    computed(bm, a)
    assert bm.release_behind(a) == 4  # blocks 0 and 1 of both sliding groups
    assert a.block_tables[0][:2] != [RELEASED] * 2
    assert a.block_tables[1][:2] == a.block_tables[2][:2] == [RELEASED] * 2
    bm.check_invariants([a])
    b = seq_of([1, 2, 3, 4, 5, 6, 7, 8, 9])  # shares a's first 3 full blocks (6 tokens)
    bm.allocate(b)
    # the token at position 6 reads keys 3..6: sliding groups need blocks 1..2 of the
    # prefix, and block 1 was released (still cached): revived
    assert b.num_cached_tokens == 6
    assert b.block_tables[0][:3] == a.block_tables[0][:3]
    assert b.block_tables[1][0] == RELEASED and b.block_tables[1][2] == a.block_tables[1][2]
    bm.check_invariants([a, b])
    bm.free(a)
    bm.free(b)
    bm.check_invariants([])
    assert bm.num_free_blocks == 20


def test_a_prefix_hit_stops_where_a_sliding_group_lost_a_block_of_its_window():
    bm = BlockManager(num_blocks=9, block_size=2, windows=(None, 4))
    a = seq_of([1, 2, 3, 4, 5, 6, 7])
    bm.allocate(a)
    computed(bm, a)
    bm.release_behind(a)
    bm.free(a)  # all cached; now evict the sliding group's block 2 (positions 4-5)
    evicted = [b for b in bm.free_list if bm.blocks[b].hash is not None
               and bm.blocks[b].hash[0] == 1 and bm.blocks[b].token_ids == (5, 6)]
    bm.free_list.move_to_end(evicted[0], last=False)
    bm.allocate(seq_of([9]))  # takes the front of the free list: the evicted block
    same = seq_of([1, 2, 3, 4, 5, 6, 7, 8])
    # 3 blocks need sliding blocks 1..2 (2 is gone); 2 blocks need 0..1: both still cached
    assert bm.cached_prefix_len(same) == 4


class PoolMachine(RuleBasedStateMachine):
    """One KV group, every layer global."""
    WINDOWS: tuple = (None,)
    NUM_BLOCKS = 12

    def __init__(self):
        super().__init__()
        self.bm = BlockManager(num_blocks=self.NUM_BLOCKS, block_size=3, windows=self.WINDOWS)
        self.live: list[Sequence] = []
        self.preempted: list[Sequence] = []
        self.content: dict[int, list] = {b: [None] * 3 for b in range(self.NUM_BLOCKS)}

    def _write(self, seq, start):
        """Simulate the forward pass: positions start.. of seq go to their slots."""
        for table in seq.block_tables:
            for pos in range(start, len(seq)):
                block = table[pos // 3]
                assert block != RELEASED, "a token to compute lies behind its window"
                assert self.bm.blocks[block].ref_count == 1 or \
                    self.content[block][pos % 3] == seq.token_ids[pos], "write into a shared block"
                self.content[block][pos % 3] = seq.token_ids[pos]
        computed(self.bm, seq)

    def _admit(self, seq):
        if not self.bm.can_allocate(seq):
            return False
        self.bm.allocate(seq)
        self._write(seq, seq.num_computed_tokens)
        self.live.append(seq)
        return True

    @rule(tokens=st.lists(st.integers(0, 2), min_size=1, max_size=10))
    def allocate(self, tokens):  # a tiny alphabet makes prefix hits common
        self._admit(seq_of(tokens))

    @precondition(lambda self: self.live)
    @rule(data=st.data(), token=st.integers(0, 2))
    def append(self, data, token):
        seq = data.draw(st.sampled_from(self.live))
        self.bm.release_behind(seq)  # as the scheduler does before each step
        seq.append_token(token)
        if not self.bm.can_append(seq):
            seq.token_ids.pop()
            return
        for src, dst in self.bm.append_slot(seq):
            self.content[dst] = list(self.content[src])
        self._write(seq, len(seq) - 1)

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def fork(self, data):
        parent = data.draw(st.sampled_from(self.live))
        child = parent.fork(1)
        self.bm.fork(parent, child)
        self.live.append(child)

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def free(self, data):
        seq = data.draw(st.sampled_from(self.live))
        self.live.remove(seq)
        self.bm.free(seq)

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def preempt(self, data):
        seq = data.draw(st.sampled_from(self.live))
        self.live.remove(seq)
        self.bm.free(seq)
        self.preempted.append(seq)

    @precondition(lambda self: self.preempted)
    @rule()
    def resume(self):
        seq = self.preempted[0]
        if self._admit(seq):
            self.preempted.pop(0)

    @invariant()
    def pool_is_consistent(self):
        self.bm.check_invariants(self.live)
        for seq in self.live:  # every position the next token reads holds its own token
            for window, table in zip(self.WINDOWS, seq.block_tables):
                assert len(table) == -(-len(seq) // 3)
                first = 0 if window is None else max(0, seq.num_computed_tokens - window + 1)
                assert RELEASED not in table[first // 3:], "a block inside the window is gone"
                for pos in range(first, seq.num_computed_tokens):
                    assert self.content[table[pos // 3]][pos % 3] == seq.token_ids[pos]

    def teardown(self):
        for seq in self.live:
            self.bm.free(seq)
        self.bm.check_invariants([])
        assert self.bm.num_free_blocks == self.bm.num_blocks


class HybridPoolMachine(PoolMachine):
    """A global group and two sliding ones (window 4) sharing one pool, as Gemma 3's."""
    WINDOWS = (None, 4, 4)
    NUM_BLOCKS = 30


class SlidingPoolMachine(PoolMachine):
    """One KV group whose layers all slide (Mistral's)."""
    WINDOWS = (4,)


TestPoolMachine = PoolMachine.TestCase
TestPoolMachine.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
TestSlidingPoolMachine = SlidingPoolMachine.TestCase
TestSlidingPoolMachine.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
TestHybridPoolMachine = HybridPoolMachine.TestCase
TestHybridPoolMachine.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
