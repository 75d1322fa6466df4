"""LoRASlots: room for max_loras adapters in a backend's memory, and LoRABatch: which
rows of one step run which adapter.

A slot holds one loaded adapter. For each product any loaded adapter targets, the
slots' terms are stacked, zero past each one's rank: A as (max_loras, max_rank, in),
B^T as (max_loras, max_rank, out), in float32 or float16 (half the bytes a step
streams; the kernels widen each value as they read it), with each slot's rank (0: it
leaves this product alone) and scale. A step's rows name their slots, so requests for
different adapters and the base run in one batch and the products that share an input
add their adapted rows' terms in one call (reference.add_lora), their stacks put
together once (ops.lora_stacks). The host arrays are the masters; the backend holds
copies (ops.upload), made again when a slot changes. The masters of a layer's products
that share an input lie in one buffer, each A before its B^T: the product before their
call hints it into the caches (reference.linear's ahead: SmolLM2's terms at 32 rows
took ~1.2 ms less a step, the step ~0.8 ms less, bench/NOTES.md).
"""
from __future__ import annotations

import numpy as np

from .config import ModelConfig
from .lora_adapter import SHARED_INPUTS, LoRAAdapter, product_shape

NO_ADAPTER = -1  # a row's slot when it runs the base model alone
RANK_PADDING = 4  # the stacks' rank dimension is a multiple of this (the CPU kernel's fours)


class _Stack:
    """One product's terms across the slots."""

    def __init__(self, slots: int, rank: int, shape: tuple[int, int], dtype):
        out, inner = shape
        rank = -(-rank // RANK_PADDING) * RANK_PADDING  # (zero terms past any rank)
        self.a = np.zeros((slots, rank, inner), dtype)
        self.bt = np.zeros((slots, rank, out), dtype)
        self.ranks = np.zeros(slots, np.int32)
        self.scales = np.zeros(slots, np.float32)
        self.held = None  # (a, bt, ranks, scales) as the backend holds them

    def put(self, slot: int, weights) -> None:
        r = weights.rank
        self.a[slot] = 0
        self.bt[slot] = 0
        self.a[slot, :r], self.bt[slot, :r] = weights.a, weights.b.T
        self.ranks[slot], self.scales[slot] = r, weights.scale

    def clear(self, slot: int) -> None:
        self.ranks[slot] = 0  # (its A and B stay until the slot is written again)


class LoRASlots:
    def __init__(self, cfg: ModelConfig, ops, max_loras: int, max_rank: int, dtype=np.float32):
        self.cfg, self.ops, self.max_loras, self.max_rank = cfg, ops, max_loras, max_rank
        self.dtype = np.dtype(dtype)  # float32 or float16
        self.stacks: dict[tuple[int, str], _Stack] = {}  # (layer, module) -> its stack
        # (layer, modules of products sharing an input) -> (which of them have stacks,
        # those stacks as ops.lora_stacks makes them), built at the first step that asks
        self.shared: dict[tuple, tuple] = {}
        self.regions: dict[tuple, np.ndarray] = {}  # (layer, modules sharing an input) -> their bytes

    def install(self, slot: int, adapter: LoRAAdapter) -> None:
        """Put adapter's terms in slot (which the caller has freed): the products it
        does not target are cleared of the slot's earlier adapter's."""
        assert 0 <= slot < self.max_loras and adapter.rank <= self.max_rank
        for stack in self.stacks.values():
            stack.clear(slot)
        for key, weights in adapter.modules.items():
            if key not in self.stacks:
                self.stacks[key] = _Stack(self.max_loras, self.max_rank, product_shape(key[1], self.cfg),
                                         self.dtype)
            self.stacks[key].put(slot, weights)
        self._regroup()
        self._upload()

    def _regroup(self) -> None:
        """Lays each group of stacks (products sharing an input) out in one buffer, where a
        stack joined the group since its buffer was made."""
        for layer in range(self.cfg.num_hidden_layers):
            for group in SHARED_INPUTS:
                stacks = [self.stacks[(layer, m)] for m in group if (layer, m) in self.stacks]
                region = self.regions.get((layer, group))
                if not stacks or region is not None and all(np.shares_memory(st.a, region) for st in stacks):
                    continue
                region = np.empty(sum(st.a.nbytes + st.bt.nbytes for st in stacks), np.uint8)
                start = 0
                for st in stacks:
                    for name in ("a", "bt"):
                        old = getattr(st, name)
                        new = region[start:start + old.nbytes].view(old.dtype).reshape(old.shape)
                        new[...] = old
                        setattr(st, name, new)
                        start += old.nbytes
                self.regions[(layer, group)] = region

    def _upload(self) -> None:
        for stack in self.stacks.values():
            stack.held = tuple(map(self.ops.upload, (stack.a, stack.bt, stack.ranks, stack.scales)))
        self.shared.clear()

    def of_products(self, layer: int, modules: tuple) -> tuple:
        """(indices into modules of the products some slot adapts, their stacks as
        ops.add_lora takes them, None where none is)."""
        key = (layer, modules)
        if key not in self.shared:
            adapted = tuple(i for i, module in enumerate(modules) if (layer, module) in self.stacks)
            stacks = self.ops.lora_stacks([self.stacks[(layer, modules[i])].held for i in adapted]) \
                if adapted else None
            self.shared[key] = adapted, stacks
        return self.shared[key]

    def batch(self, row_slots: np.ndarray) -> "LoRABatch | None":
        """The step whose token rows run row_slots (T,) (NO_ADAPTER: the base); None
        when no row runs an adapter."""
        adapted = np.flatnonzero(row_slots != NO_ADAPTER)
        if len(adapted) == 0 or not self.stacks:
            return None
        rows = adapted[np.argsort(row_slots[adapted], kind="stable")].astype(np.int32)
        slots = row_slots[rows].astype(np.int32)
        return LoRABatch(self, self.ops.lora_groups(rows, slots))


class LoRABatch:
    """One step's adapted rows (grouped by slot) and their slots, in the form the
    backend's add_lora takes them (ops.lora_groups)."""

    def __init__(self, slots: LoRASlots, groups: tuple):
        self.slots, self.groups = slots, groups

    def ahead(self, layer: int, modules: tuple) -> np.ndarray | None:
        """The bytes the call for these products (sharing an input) reads: ops.linear's
        ahead for the product before it."""
        return self.slots.regions.get((layer, modules))

    def adapts(self, layer: int, module: str) -> bool:
        return (layer, module) in self.slots.stacks

    def add(self, x, layer: int, *products) -> None:
        """products: (y, module) pairs, each y (T, out) the product of x (T, in): the
        adapted rows' terms added to them in place (one call for all: they share x)."""
        adapted, stacks = self.slots.of_products(layer, tuple(module for _, module in products))
        if stacks is not None:
            self.slots.ops.add_lora(x, tuple(products[i][0] for i in adapted), stacks, *self.groups)
