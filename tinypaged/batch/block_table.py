"""Slot arithmetic: where token i of a sequence lives in the KV pool.

slot = block_table[i // block_size] * block_size + i % block_size, and the pool
viewed as (num_blocks * block_size, n_kv, D) is indexed by slot. Every paged
engine's worst bugs have lived here, so these are small pure functions with
their own tests.
"""
from __future__ import annotations

import numpy as np

PAD_BLOCK = -1  # fills block-table rows past a sequence's last block


def slot_of(block_table: list[int], position: int, block_size: int) -> int:
    return block_table[position // block_size] * block_size + position % block_size


def slot_mapping(block_table: list[int], start: int, end: int, block_size: int) -> np.ndarray:
    """Slots of positions start..end-1 of one sequence, (end - start,) int64."""
    positions = np.arange(start, end)
    table = np.asarray(block_table, dtype=np.int64)
    return table[positions // block_size] * block_size + positions % block_size


def padded_block_tables(tables: list[list[int]]) -> np.ndarray:
    """(S, max_blocks) int32, rows padded with PAD_BLOCK."""
    width = max((len(t) for t in tables), default=0)
    out = np.full((len(tables), max(width, 1)), PAD_BLOCK, dtype=np.int32)
    for i, table in enumerate(tables):
        out[i, :len(table)] = table
    return out
