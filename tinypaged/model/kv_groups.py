"""KV groups: which layers share a block table, so that sliding layers' K/V stop
growing past their window while global layers keep every token.

Layers are split into groups of equal size, each group holding layers of one
window (None: global). A sequence has one block table per group, and every group
draws its blocks from the same pool: a block is (layers_per_group, block_size,
n_kv, D) of K and of V, whichever group holds it. Equal-sized groups are what let
one pool serve them all (vLLM's hybrid allocator does the same), so memory flows
to whichever group needs it instead of being split between them up front.

Gemma 3 270M (18 layers, every 6th global): groups of 3 layers, one global group
(layers 5, 11, 17) and five sliding ones. A model whose layers all share one window
(or none) has one group of every layer: the plain paged cache.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from .config import ModelConfig


def blocks_for(num_tokens: int, block_size: int) -> int:
    return -(-num_tokens // block_size)


@dataclass(slots=True, frozen=True)
class KVGroups:
    windows: tuple[int | None, ...]  # per group: the tokens its layers attend to (None: all)
    group_of: tuple[int, ...]  # per layer: its group
    slot_of: tuple[int, ...]  # per layer: its index inside its group's blocks

    @property
    def num_groups(self) -> int:
        return len(self.windows)

    @property
    def layers_per_group(self) -> int:
        return len(self.group_of) // len(self.windows)

    @classmethod
    def of(cls, cfg: ModelConfig) -> "KVGroups":
        """Layers grouped by window, each window's layers cut in layer order into groups
        of gcd(layers per window) layers."""
        windows = [cfg.window(layer) for layer in range(cfg.num_hidden_layers)]
        by_window: dict[int | None, list[int]] = {}
        for layer, window in enumerate(windows):
            by_window.setdefault(window, []).append(layer)
        size = math.gcd(*map(len, by_window.values()))
        group_windows, group_of, slot_of = [], [0] * len(windows), [0] * len(windows)
        for window, layers in by_window.items():
            for start in range(0, len(layers), size):
                for slot, layer in enumerate(layers[start:start + size]):
                    group_of[layer], slot_of[layer] = len(group_windows), slot
                group_windows.append(window)
        return cls(tuple(group_windows), tuple(group_of), tuple(slot_of))

    # -- how many blocks a sequence holds ----------------------------------------
    def blocks_held(self, num_tokens: int, block_size: int) -> int:
        """Blocks over all groups that a decoding sequence holds during the step that
        computes its token at position num_tokens - 1: every block in a global group;
        in a sliding one only those from the block of that token's first key on."""
        last = num_tokens - 1
        total = 0
        for window in self.windows:
            first = 0 if window is None else max(0, last - window + 1)
            total += last // block_size - first // block_size + 1
        return total

    def blocks_at_admission(self, num_tokens: int, block_size: int) -> int:
        """Blocks a prompt of num_tokens takes when admitted: all of them in every group
        (its prefill writes every layer's K/V before the window moves on)."""
        return self.num_groups * blocks_for(num_tokens, block_size)
