"""AttentionMetadata: everything the kernels need to know about one step's batch."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .block_table import padded_block_tables, slot_mapping


@dataclass(slots=True)
class AttentionMetadata:
    """A step computes T tokens belonging to S sequences, laid out sequence by sequence.

    Token t belongs to batch sequence token_seq[t], sits at absolute position
    positions[t] and writes its K/V to pool slot slot_mapping[t]; it attends to
    positions 0..positions[t] of its sequence through block_tables[token_seq[t]].
    """
    positions: np.ndarray  # (T,) int64
    slot_mapping: np.ndarray  # (T,) int64
    token_seq: np.ndarray  # (T,) int32
    block_tables: np.ndarray  # (S, max_blocks) int32, padded with -1
    context_lens: np.ndarray  # (S,) int32: tokens in each sequence's KV after this step
    logits_indices: np.ndarray  # (R,) int64: rows that need logits (each sequence's last, or more)

    @property
    def num_tokens(self) -> int:
        return len(self.positions)

    @classmethod
    def build(cls, chunks: list[tuple[list[int], int, int]], block_size: int,
              logits_rows: list[int] | None = None) -> "AttentionMetadata":
        """chunks: per sequence (block_table, first position to compute, end position).
        logits_rows: per chunk, how many of its last rows need logits (default 1; all of
        them for prompt logprobs)."""
        positions, slots, token_seq, context_lens, last_rows = [], [], [], [], []
        row = 0
        for i, (table, start, end) in enumerate(chunks):
            positions.append(np.arange(start, end))
            slots.append(slot_mapping(table, start, end, block_size))
            token_seq.append(np.full(end - start, i, dtype=np.int32))
            context_lens.append(end)
            row += end - start
            n_rows = logits_rows[i] if logits_rows is not None else 1
            assert 1 <= n_rows <= end - start
            last_rows.extend(range(row - n_rows, row))
        return cls(positions=np.concatenate(positions).astype(np.int64),
                   slot_mapping=np.concatenate(slots).astype(np.int64),
                   token_seq=np.concatenate(token_seq),
                   block_tables=padded_block_tables([c[0] for c in chunks]),
                   context_lens=np.asarray(context_lens, dtype=np.int32),
                   logits_indices=np.asarray(last_rows, dtype=np.int64))
