"""RopeTables: each layer's RoPE angles as (cos, sin) tables, (positions, D/2), one pair
per rope kind the layers use (ops.rope_tables computes them).

On a host backend the tables cover the positions the steps have reached, grown by
doubling as longer sequences come: Gemma 3's 32,768 positions x 2 kinds were 67 MB
held from the load on, for prompts that mostly reach a few hundred. On the CUDA
backend they cover every position from the start (device memory, and a recorded
step reads fixed buffers).
"""
from __future__ import annotations

FIRST_ROWS = 1024  # positions a host table covers before a step needs more


class RopeTables:
    def __init__(self, cfg, ops, max_positions: int):
        self.cfg, self.ops, self.max_positions = cfg, ops, max_positions
        self.grows = ops.name != "cuda"
        self._build(min(FIRST_ROWS, max_positions) if self.grows else max_positions)

    def _build(self, rows: int) -> None:
        cfg = self.cfg
        tables = {}  # Rope -> (cos, sin)
        for rope in map(cfg.rope_of, range(cfg.num_hidden_layers)):
            if rope not in tables:
                tables[rope] = self.ops.rope_tables(rows, cfg.head_dim, rope)
        self.rows = rows
        self.of_layer = [tables[cfg.rope_of(layer)] for layer in range(cfg.num_hidden_layers)]

    def cover(self, positions) -> None:
        """Before a step whose tokens sit at `positions` (a host array): the tables
        reach the last of them (the rows already there unchanged, bit for bit)."""
        if not self.grows or not len(positions):
            return
        needed = int(positions.max()) + 1
        if needed > self.rows:
            self._build(max(needed, min(2 * self.rows, self.max_positions)))
