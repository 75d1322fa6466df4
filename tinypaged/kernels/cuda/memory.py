"""Device memory the CUDA backend manages itself: a step workspace and the
per-step metadata buffer. After the first steps have grown them, the step loop
allocates nothing on the device."""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
from numba import cuda


class StepWorkspace:
    """Bump allocator over one float32 device buffer, reset at the start of each step.

    Every activation of a step (all layers) is carved from it, so its size is about
    T x n_layers x (the widths of one layer's temporaries). When a step needs more,
    a buffer twice the size replaces it; arrays already handed out keep the old
    one alive until they die.
    """

    def __init__(self):
        self.buffer = None
        self.used = 0
        self.allocations = 0  # buffers made so far (a recorded step checks it did not grow)

    def reset(self) -> None:
        self.used = 0

    def take(self, shape: tuple[int, ...]):
        n = int(np.prod(shape))
        if self.buffer is None or self.used + n > self.buffer.size:
            self.buffer = cuda.device_array(max(2 * (self.used + n), 1 << 20), dtype=np.float32)
            self.used = 0
            self.allocations += 1
        view = self.buffer[self.used:self.used + n].reshape(shape)
        self.used += -(-n // 64) * 64  # keep every array 256-byte aligned
        return view


@dataclass(slots=True)
class DeviceMetadata:
    """AttentionMetadata's arrays on the device, plus the attention work split:
    decode_rows (rows of single-token sequences, with their positions and sequences)
    and prefill_tiles ((r0, nq) runs of at most Q_TILE consecutive query rows of one
    sequence)."""
    positions: object
    slot_mapping: object
    token_seq: object
    block_tables: object
    logits_indices: object
    decode_rows: object
    decode_positions: object  # positions[decode_rows] (a decode kernel reads them with its row)
    decode_tables: object  # block_tables[token_seq[decode_rows]]: row i's (so are its block ids)
    prefill_tiles: object
    num_decode: int
    num_tiles: int
    decode_keys: int = 1  # the decode grid covers contexts up to this many keys (covering_keys)
    groups: tuple = ()  # per KV group past the first, (block_tables, slot_mapping, decode_tables)

    def for_group(self, group: int) -> "DeviceMetadata":
        """The metadata of KV group `group`'s layers (AttentionMetadata.for_group)."""
        if group == 0:
            return self
        tables, slots, decode_tables = self.groups[group - 1]
        return replace(self, block_tables=tables, slot_mapping=slots, decode_tables=decode_tables,
                       groups=())


def covering_keys(n_keys: int, fewest: int) -> int:
    """The keys a decode grid covers for contexts of up to n_keys keys: `fewest` (a
    power of two) or the next power of two past it, so that a recorded step serves a
    range of context lengths (its split into partitions: attention.decode_split)."""
    n = fewest
    while n < n_keys:
        n *= 2
    return n


def attention_work(token_seq: np.ndarray, q_tile: int) -> tuple[np.ndarray, np.ndarray]:
    """Split a step's rows: single-token sequences go to the decode kernel, the others
    into tiles of up to q_tile consecutive rows for the prefill kernel."""
    decode_rows, tiles = [], []
    starts = np.flatnonzero(np.r_[True, token_seq[1:] != token_seq[:-1]])
    ends = np.r_[starts[1:], len(token_seq)]
    for start, end in zip(starts, ends):
        if end - start == 1:
            decode_rows.append(start)
        else:
            tiles += [(r, min(q_tile, end - r)) for r in range(start, end, q_tile)]
    return (np.asarray(decode_rows, dtype=np.int32),
            np.asarray(tiles, dtype=np.int32).reshape(-1, 2))


class MetadataUploader:
    """Packs a step's token ids and metadata into one int32 host buffer and sends it
    to a preallocated device buffer in one transfer; returns device views of it."""

    def __init__(self):
        self.device = None

    def upload(self, token_ids: np.ndarray, meta, q_tile: int, fewest_keys: int):
        decode_rows, tiles = attention_work(meta.token_seq, q_tile)
        longest = int(meta.positions[decode_rows].max()) + 1 if len(decode_rows) else 1
        decode_seqs = meta.token_seq[decode_rows]
        parts = [token_ids, meta.positions, meta.slot_mapping, meta.token_seq,
                 meta.logits_indices, decode_rows, tiles.ravel(), meta.block_tables.ravel(),
                 meta.positions[decode_rows], meta.block_tables[decode_seqs].ravel()]
        for tables, slots in meta.groups:  # further KV groups' tables and slots
            parts += [tables.ravel(), slots, tables[decode_seqs].ravel()]
        packed = np.concatenate([np.asarray(p, dtype=np.int32).ravel() for p in parts])
        if self.device is None or self.device.size < packed.size:
            self.device = cuda.device_array(max(2 * packed.size, 4096), dtype=np.int32)
        self.device[:packed.size].copy_to_device(packed)
        views, offset = [], 0
        for p in parts:
            views.append(self.device[offset:offset + p.size])
            offset += p.size
        ids, positions, slots, token_seq, logits_rows, rows, tile_flat, tables = views[:8]
        row_positions, row_tables = views[8:10]

        def decode_tables(view, tables):  # (rows, width), width = the step's tables'
            return view.reshape(len(decode_rows), tables.shape[1])
        groups = tuple((views[i].reshape(tables.shape), views[i + 1], decode_tables(views[i + 2], tables))
                       for i, (tables, _) in zip(range(10, len(views), 3), meta.groups))
        return ids, DeviceMetadata(
            positions=positions, slot_mapping=slots, token_seq=token_seq,
            block_tables=tables.reshape(meta.block_tables.shape), logits_indices=logits_rows,
            decode_rows=rows, decode_positions=row_positions,
            decode_tables=decode_tables(row_tables, meta.block_tables),
            prefill_tiles=tile_flat.reshape(tiles.shape),
            num_decode=len(decode_rows), num_tiles=len(tiles),
            decode_keys=covering_keys(longest, fewest_keys), groups=groups)
