"""The inputs of a static decode step: fixed shapes per batch-size bucket, one
fixed device buffer per bucket, rewritten by one upload each step.

A decode step of B sequences (one new token each) runs as the step of the
smallest bucket >= B (1, 2, 4, 8, ...). Rows B.. are padding: token 0, position
-1 (the kernels that read the KV pool or write it exit at once on it), slot -1,
a block-table row of PAD_BLOCK. Block tables are padded to max_blocks columns
(max_model_len / block_size), so no shape depends on the batch.
"""
from __future__ import annotations

import numpy as np
from numba import cuda

from ...batch.block_table import PAD_BLOCK
from .memory import DeviceMetadata

PAD_POSITION = -1


def bucket_sizes(max_batch: int) -> list[int]:
    """1, 2, 4, ... up to the first power of two >= max_batch."""
    sizes = [1]
    while sizes[-1] < max_batch:
        sizes.append(2 * sizes[-1])
    return sizes


def bucket_for(n_rows: int, buckets: list[int]) -> int:
    """The smallest bucket that holds n_rows (ValueError past the largest)."""
    for size in buckets:
        if n_rows <= size:
            return size
    raise ValueError(f"a decode batch of {n_rows} rows exceeds the largest bucket {buckets[-1]}")


def pack_decode_step(token_ids: np.ndarray, meta, bucket: int, max_blocks: int) -> np.ndarray:
    """The per-step part of a bucket's buffer, (bucket * (2 + G * (1 + max_blocks)),)
    int32 for G KV groups: token ids | positions | then per group, slots | block
    tables (bucket, max_blocks), padded."""
    n = len(token_ids)
    assert n <= bucket and meta.block_tables.shape[1] <= max_blocks
    ids = np.zeros(bucket, dtype=np.int32)
    positions = np.full(bucket, PAD_POSITION, dtype=np.int32)
    ids[:n], positions[:n] = token_ids, meta.positions
    parts = [ids, positions]
    for g in range(meta.num_groups):
        group = meta.for_group(g)
        slots = np.full(bucket, PAD_POSITION, dtype=np.int32)
        tables = np.full((bucket, max_blocks), PAD_BLOCK, dtype=np.int32)
        slots[:n] = group.slot_mapping
        tables[:n, :group.block_tables.shape[1]] = group.block_tables
        parts += [slots, tables.ravel()]
    return np.concatenate(parts)


class StaticDecodeInputs:
    """One bucket's device buffer: [per-step part | 0..bucket-1], the second part
    (token_seq, decode_rows and logits_indices: row i is sequence i, so the block
    tables are the decode rows' too) written once."""

    def __init__(self, bucket: int, max_blocks: int, num_groups: int = 1):
        self.bucket, self.max_blocks = bucket, max_blocks
        b, per_group = bucket, bucket * (1 + max_blocks)
        self.step_size = 2 * b + num_groups * per_group
        rows = np.arange(bucket, dtype=np.int32)
        self.device = cuda.to_device(np.concatenate([np.zeros(self.step_size, np.int32), rows]))
        self.token_ids = self.device[:b]
        rows_dev = self.device[self.step_size:]
        groups = []  # (block tables, slots, decode rows' tables: the same) views per KV group
        for g in range(num_groups):
            start = 2 * b + g * per_group
            tables = self.device[start + b:start + per_group].reshape(b, max_blocks)
            groups.append((tables, self.device[start:start + b], tables))
        self.meta = DeviceMetadata(
            positions=self.device[b:2 * b], slot_mapping=groups[0][1],
            token_seq=rows_dev, block_tables=groups[0][0],
            logits_indices=rows_dev, decode_rows=rows_dev, decode_positions=self.device[b:2 * b],
            decode_tables=groups[0][0],
            prefill_tiles=self.device[:0].reshape(0, 2), num_decode=b, num_tiles=0,
            groups=tuple(groups[1:]))

    def upload(self, token_ids: np.ndarray, meta) -> None:
        """One host-to-device copy of the step's token ids and metadata."""
        packed = pack_decode_step(token_ids, meta, self.bucket, self.max_blocks)
        self.device[:self.step_size].copy_to_device(packed)
