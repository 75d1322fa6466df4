"""AttentionMetadata: everything the kernels need to know about one step's batch."""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from .block_table import padded_block_tables, slot_mapping


@dataclass(slots=True)
class AttentionMetadata:
    """A step computes T tokens belonging to S sequences, laid out sequence by sequence.

    Token t belongs to batch sequence token_seq[t], sits at absolute position
    positions[t] and writes its K/V to pool slot slot_mapping[t]; it attends to
    positions 0..positions[t] of its sequence through block_tables[token_seq[t]].

    A model whose layers form several KV groups (model/kv_groups.py) has a table
    and a slot per token for each group: block_tables and slot_mapping are group
    0's, `groups` holds (block_tables, slot_mapping) of each further group, and
    for_group(g) is the metadata group g's layers read.
    """
    positions: np.ndarray  # (T,) int64
    slot_mapping: np.ndarray  # (T,) int64
    token_seq: np.ndarray  # (T,) int32
    block_tables: np.ndarray  # (S, max_blocks) int32, padded with -1
    context_lens: np.ndarray  # (S,) int32: tokens in each sequence's KV after this step
    logits_indices: np.ndarray  # (R,) int64: rows that need logits (each sequence's last, or more)
    groups: tuple = ()  # per KV group past the first, (block_tables, slot_mapping)

    @property
    def num_tokens(self) -> int:
        return len(self.positions)

    @property
    def num_groups(self) -> int:
        return 1 + len(self.groups)

    def for_group(self, group: int) -> "AttentionMetadata":
        """The metadata of KV group `group`'s layers: its tables and slots."""
        if group == 0:
            return self
        tables, slots = self.groups[group - 1]
        return replace(self, block_tables=tables, slot_mapping=slots, groups=())

    @classmethod
    def build(cls, chunks: list[tuple[list[int], int, int]], block_size: int,
              logits_rows: list[int] | None = None) -> "AttentionMetadata":
        """chunks: per sequence (block_table, first position to compute, end position),
        one KV group. logits_rows: per chunk, how many of its last rows need logits
        (default 1; all of them for prompt logprobs)."""
        return cls.build_grouped([([table], start, end) for table, start, end in chunks],
                                 block_size, logits_rows)

    @classmethod
    def build_grouped(cls, chunks: list[tuple[list[list[int]], int, int]], block_size: int,
                      logits_rows: list[int] | None = None) -> "AttentionMetadata":
        """As build(), with each sequence's block table per KV group."""
        positions, token_seq, context_lens, last_rows = [], [], [], []
        row = 0
        for i, (_, start, end) in enumerate(chunks):
            positions.append(np.arange(start, end))
            token_seq.append(np.full(end - start, i, dtype=np.int32))
            context_lens.append(end)
            row += end - start
            n_rows = logits_rows[i] if logits_rows is not None else 1
            assert 1 <= n_rows <= end - start
            last_rows.extend(range(row - n_rows, row))
        per_group = []
        for g in range(len(chunks[0][0])):
            slots = [slot_mapping(tables[g], start, end, block_size) for tables, start, end in chunks]
            per_group.append((padded_block_tables([tables[g] for tables, _, _ in chunks]),
                              np.concatenate(slots).astype(np.int64)))
        return cls(positions=np.concatenate(positions).astype(np.int64),
                   slot_mapping=per_group[0][1],
                   token_seq=np.concatenate(token_seq),
                   block_tables=per_group[0][0],
                   context_lens=np.asarray(context_lens, dtype=np.int32),
                   logits_indices=np.asarray(last_rows, dtype=np.int64),
                   groups=tuple(per_group[1:]))
