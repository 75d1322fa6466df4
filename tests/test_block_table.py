"""Slot arithmetic, by hand-worked examples and against a token-by-token walk."""
import numpy as np
from hypothesis import given, strategies as st

from tinypaged.batch.attention_metadata import AttentionMetadata
from tinypaged.batch.block_table import PAD_BLOCK, padded_block_tables, slot_mapping, slot_of


def test_hand_worked_slots():
    table = [7, 2, 9]  # block size 4: positions 0-3 in block 7, 4-7 in block 2, 8-11 in block 9
    assert slot_of(table, 0, 4) == 28
    assert slot_of(table, 5, 4) == 9
    assert slot_of(table, 11, 4) == 39
    np.testing.assert_array_equal(slot_mapping(table, 3, 9, 4), [31, 8, 9, 10, 11, 36])


@given(st.integers(1, 33), st.lists(st.integers(0, 200), min_size=1, max_size=12, unique=True),
       st.data())
def test_slot_mapping_agrees_with_slot_of(block_size, table, data):
    n = len(table) * block_size
    start = data.draw(st.integers(0, n - 1))
    end = data.draw(st.integers(start + 1, n))
    expected = [slot_of(table, p, block_size) for p in range(start, end)]
    np.testing.assert_array_equal(slot_mapping(table, start, end, block_size), expected)
    assert len(set(expected)) == len(expected)  # distinct positions never share a slot


def test_padded_block_tables():
    out = padded_block_tables([[3, 1], [5], [0, 2, 4]])
    np.testing.assert_array_equal(out, [[3, 1, PAD_BLOCK], [5, PAD_BLOCK, PAD_BLOCK], [0, 2, 4]])
    assert out.dtype == np.int32


def test_metadata_of_a_mixed_batch():
    # a prefill of positions 2..4 (2 cached), then a decode at position 6, block size 2
    meta = AttentionMetadata.build([([4, 0, 3], 2, 5), ([1, 6, 8, 5], 6, 7)], 2)
    np.testing.assert_array_equal(meta.positions, [2, 3, 4, 6])
    np.testing.assert_array_equal(meta.slot_mapping, [0, 1, 6, 10])
    np.testing.assert_array_equal(meta.token_seq, [0, 0, 0, 1])
    np.testing.assert_array_equal(meta.context_lens, [5, 7])
    np.testing.assert_array_equal(meta.logits_indices, [2, 3])
    np.testing.assert_array_equal(meta.block_tables, [[4, 0, 3, -1], [1, 6, 8, 5]])
