"""LoRAAdapters: the engine's loaded LoRA adapters by name, the slot each holds, and
the step's rows that run them.

An adapter is read and checked off the loop thread (read: the folder against the
model's config), then put in a free slot on it (install). Unloading takes the name
away at once: new requests naming it are refused, but the requests already in the
engine keep their slot and finish with it; the slot is free again once none is left.
Each load gets an id of its own that seeds its sequences' block hashes, so the prefix
cache never shares a block between two adapters, nor with the base, nor with an
earlier adapter loaded under the same name.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from ..config import EngineConfig
from ..model.config import ModelConfig
from ..model.lora_adapter import LoRAAdapter
from ..model.lora_slots import NO_ADAPTER, LoRABatch, LoRASlots


@dataclass(frozen=True)
class LoadedAdapter:
    name: str
    path: str
    rank: int
    slot: int
    load_id: int  # unique per load: its sequences' hash seed


def lora_dtype(asked: str, model_dtype: str) -> str:
    """EngineConfig.lora_dtype resolved: "auto" is float32 for a float32 model, else
    float16."""
    if asked != "auto":
        return asked
    return "float32" if model_dtype == "float32" else "float16"


class LoRAAdapters:
    def __init__(self, cfg: ModelConfig, ops, config: EngineConfig, requests: dict):
        """requests: the engine's live requests (a slot is in use while one holds it)."""
        self.cfg, self.ops, self.enabled = cfg, ops, config.enable_lora
        self.max_loras, self.max_rank = config.max_loras, config.max_lora_rank
        self.dtype = lora_dtype(config.lora_dtype, cfg.dtype)
        self.requests = requests
        self.loaded: dict[str, LoadedAdapter] = {}
        self.slots: LoRASlots | None = None  # allocated with the first adapter
        self._load_ids = itertools.count(1)
        for name, path in (config.lora_modules or {}).items():  # (the adapters named at start)
            self.install(name, self.read(name, path))

    def read(self, name: str, path: str) -> LoRAAdapter:
        """The adapter folder at path, read and checked (any thread: touches no engine state)."""
        if not self.enabled:
            raise ValueError("LoRA adapters are off: start the engine with enable_lora=True "
                             "(--enable-lora) or lora_modules")
        if not isinstance(name, str) or not name:
            raise ValueError(f"a LoRA adapter's name must be a non-empty string, got {name!r}")
        return LoRAAdapter.load(path, self.cfg, self.max_rank)

    def install(self, name: str, adapter: LoRAAdapter) -> LoadedAdapter:
        """Put a read adapter in a free slot under name (the loop thread)."""
        if name in self.loaded:
            raise ValueError(f"a LoRA adapter named {name!r} is already loaded; unload it first")
        in_use = {a.slot for a in self.loaded.values()} | {
            seq.lora_slot for request in self.requests.values() for seq in request.seqs}
        free = [slot for slot in range(self.max_loras) if slot not in in_use]
        if not free:
            raise ValueError(f"max_loras={self.max_loras} adapters are loaded (or still "
                             f"finishing requests); unload one first")
        if self.slots is None:
            self.slots = LoRASlots(self.cfg, self.ops, self.max_loras, self.max_rank, self.dtype)
        self.slots.install(free[0], adapter)
        loaded = LoadedAdapter(name, adapter.path, adapter.rank, free[0], next(self._load_ids))
        self.loaded[name] = loaded
        return loaded

    def unload(self, name: str) -> None:
        """Take name away (the loop thread); its running requests keep their slot."""
        if name not in self.loaded:
            raise KeyError(f"no LoRA adapter named {name!r} is loaded")
        del self.loaded[name]

    def resolve(self, name: str | None) -> tuple[int, int | None]:
        """(slot, hash seed) of a request naming adapter `name` (None: the base)."""
        if name is None:
            return NO_ADAPTER, None
        loaded = self.loaded.get(name)
        if loaded is None:
            raise ValueError(f"no LoRA adapter named {name!r} is loaded"
                             + (f" (loaded: {', '.join(map(repr, self.loaded))})" if self.loaded else ""))
        return loaded.slot, loaded.load_id

    def batch(self, chunks: list) -> LoRABatch | None:
        """The step's LoRABatch: chunks (sequence, tokens) in the order of the rows."""
        if self.slots is None:
            return None
        slots = [seq.lora_slot for seq, _ in chunks]
        if all(slot == NO_ADAPTER for slot in slots):
            return None
        return self.slots.batch(np.repeat(np.array(slots, np.int64), [n for _, n in chunks]))
