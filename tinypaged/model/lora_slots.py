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
copies (ops.upload), made again when a slot changes.

The masters of a layer's products that share an input lie in one buffer, slot by slot
(a slot's A and B^T of each product, then the next slot's): the product before their
call hints the slots the step runs into the caches (reference.linear's ahead), and the
CPU's threads, which split the call's rows by slot, each find theirs in the share
their own thread hinted (bench/NOTES.md, "twenty-fourth session").
"""
from __future__ import annotations

import numpy as np

from .config import ModelConfig
from .lora_adapter import SHARED_INPUTS, LoRAAdapter, product_shape

NO_ADAPTER = -1  # a row's slot when it runs the base model alone
RANK_PADDING = 4  # the stacks' rank dimension is a multiple of this (the CPU kernel's fours)


class _Stack:
    """One product's terms across the slots: a (slots, R, in) and bt (slots, R, out),
    views into its group's buffer (LoRASlots._lay_out)."""

    def __init__(self, slots: int, rank: int, shape: tuple[int, int]):
        self.rank = -(-rank // RANK_PADDING) * RANK_PADDING  # (zero terms past any rank)
        self.shape = shape  # (out, in)
        self.a = self.bt = None
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


def slot_major(slots: int, shapes: list, dtype) -> tuple[np.ndarray, list]:
    """A zeroed (slots, bytes a slot) uint8 buffer and a (slots, *shape) view of dtype
    into it for each of shapes, slot by slot: slot s's parts lie together, each
    starting on a cache line."""
    dtype = np.dtype(dtype)
    sizes = [-(-int(np.prod(shape)) * dtype.itemsize // 64) * 64 for shape in shapes]
    region = np.zeros((slots, sum(sizes)), np.uint8)
    views, at = [], 0
    for shape, size in zip(shapes, sizes):
        strides = (region.strides[0],) + tuple(int(np.prod(shape[i + 1:])) * dtype.itemsize
                                               for i in range(len(shape)))
        views.append(np.ndarray((slots, *shape), dtype, buffer=region, offset=at, strides=strides))
        at += size
    return region, views


class LoRASlots:
    def __init__(self, cfg: ModelConfig, ops, max_loras: int, max_rank: int, dtype=np.float32):
        self.cfg, self.ops, self.max_loras, self.max_rank = cfg, ops, max_loras, max_rank
        self.dtype = np.dtype(dtype)  # float32 or float16
        self.stacks: dict[tuple[int, str], _Stack] = {}  # (layer, module) -> its stack
        # (layer, modules of products sharing an input) -> (which of them have stacks,
        # those stacks as ops.lora_stacks makes them), built at the first step that asks
        self.shared: dict[tuple, tuple] = {}
        # (layer, modules sharing an input) -> their stacks' buffer (slots, bytes a slot)
        self.regions: dict[tuple, np.ndarray] = {}

    def install(self, slot: int, adapter: LoRAAdapter) -> None:
        """Put adapter's terms in slot (which the caller has freed): the products it
        does not target are cleared of the slot's earlier adapter's."""
        assert 0 <= slot < self.max_loras and adapter.rank <= self.max_rank
        for stack in self.stacks.values():
            stack.clear(slot)
        for key in adapter.modules:
            if key not in self.stacks:
                self.stacks[key] = _Stack(self.max_loras, self.max_rank, product_shape(key[1], self.cfg))
        self._lay_out()
        for key, weights in adapter.modules.items():
            self.stacks[key].put(slot, weights)
        self._upload()

    def _lay_out(self) -> None:
        """Lays each group of stacks (products sharing an input) out in one buffer
        (slot_major), where a stack joined the group since its buffer was made: the
        stacks there before keep their values."""
        for layer in range(self.cfg.num_hidden_layers):
            for group in SHARED_INPUTS:
                stacks = [self.stacks[(layer, m)] for m in group if (layer, m) in self.stacks]
                if not stacks or all(st.a is not None for st in stacks):
                    continue
                shapes = [(st.rank, dim) for st in stacks for dim in (st.shape[1], st.shape[0])]
                region, views = slot_major(self.max_loras, shapes, self.dtype)
                for st, a, bt in zip(stacks, views[::2], views[1::2]):
                    if st.a is not None:
                        a[...], bt[...] = st.a, st.bt
                    st.a, st.bt = a, bt
                self.regions[(layer, group)] = region

    def _upload(self) -> None:
        for stack in self.stacks.values():
            stack.held = tuple(map(self.ops.upload, (stack.a, stack.bt, stack.ranks, stack.scales)))
        self.shared.clear()

    def of_products(self, layer: int, modules: tuple) -> tuple:
        """(indices into modules, a group of SHARED_INPUTS, of the products some slot
        adapts, their stacks as ops.add_lora takes them, None where none is)."""
        key = (layer, modules)
        if key not in self.shared:
            adapted = tuple(i for i, module in enumerate(modules) if (layer, module) in self.stacks)
            stacks = self.ops.lora_stacks([self.stacks[(layer, modules[i])].held for i in adapted],
                                          self.regions[key]) if adapted else None
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
        return LoRABatch(self, self.ops.lora_groups(rows, slots), (int(slots[0]), int(slots[-1]) + 1))


class LoRABatch:
    """One step's adapted rows (grouped by slot) and their slots, in the form the
    backend's add_lora takes them (ops.lora_groups)."""

    def __init__(self, slots: LoRASlots, groups: tuple, used: tuple[int, int]):
        self.slots, self.groups = slots, groups
        self.used = slice(*used)  # the slots the step's rows run, first to last

    def ahead(self, layer: int, modules: tuple) -> np.ndarray | None:
        """The bytes the call for these products (sharing an input) reads, of the slots
        the step runs: ops.linear's ahead for the product before it."""
        region = self.slots.regions.get((layer, modules))
        return None if region is None else region[self.used].reshape(-1)

    def adapts(self, layer: int, module: str) -> bool:
        return (layer, module) in self.slots.stacks

    def add(self, x, layer: int, modules: tuple, ys: tuple) -> None:
        """ys: the products of x (T, in) for modules (a group of SHARED_INPUTS), each y
        (T, out): the adapted rows' terms added to them in place (one call for all:
        they share x)."""
        adapted, stacks = self.slots.of_products(layer, modules)
        if stacks is not None:
            if len(adapted) < len(ys):
                ys = tuple(ys[i] for i in adapted)
            self.slots.ops.add_lora(x, ys, stacks, *self.groups)
