"""How a model's hidden states become one embedding: the pooling sentence-transformers
stores beside the weights (modules.json, <Pooling>/config.json, a Normalize module), or
a GGUF file's `<arch>.pooling_type`, else the default: the last token's state,
normalized (vLLM's default for a decoder's embeddings; Qwen3-Embedding's own).

Modes: "last" (the last token's, as sentence-transformers' lasttoken), "mean" (every
token's, the prompt's special tokens included), "cls" (the first token's). A module or
mode tinypaged does not compute (a Dense layer, max pooling) is refused by name.

Shorter embeddings (Matryoshka): a model whose config.json says `is_matryoshka: true`
(any size) or lists `matryoshka_dimensions` (vLLM's keys) gives its first d values,
normalized again where the pooling normalizes (OpenAI's and vLLM's `dimensions`).
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, replace

import numpy as np

POOLING_MODES = ("last", "mean", "cls")
# sentence-transformers' names (its newer "pooling_mode", its older flags) -> ours
_ST_MODES = {"lasttoken": "last", "mean": "mean", "cls": "cls"}
_ST_FLAGS = {"pooling_mode_lasttoken": "last", "pooling_mode_mean_tokens": "mean",
             "pooling_mode_cls_token": "cls"}
_ST_OTHER_FLAGS = ("pooling_mode_max_tokens", "pooling_mode_mean_sqrt_len_tokens",
                   "pooling_mode_weightedmean_tokens")
GGUF_POOLING = {1: "mean", 2: "cls", 3: "last"}  # llama.cpp's pooling_type (0: none, 4: rank)


@dataclass(frozen=True, slots=True)
class Pooling:
    mode: str = "last"
    normalize: bool = True
    source: str = "default"  # where it was read: "sentence-transformers", "gguf", "default"
    matryoshka: bool | tuple = False  # shorter sizes it was trained for: True (any), or these

    def __post_init__(self):
        if self.mode not in POOLING_MODES:
            raise ValueError(f"pooling mode {self.mode!r} is not one of {', '.join(POOLING_MODES)}")

    def shortened(self, vector, dimensions: int | None, width: int):
        """vector (width,) as `dimensions` values (None: all); ValueError where the model
        declares no such size."""
        if dimensions is None or dimensions == width:
            return vector
        if isinstance(dimensions, bool) or not isinstance(dimensions, int) or not 0 < dimensions < width:
            raise ValueError(f"dimensions={dimensions!r} must be an integer in [1, {width}]")
        if self.matryoshka is not True and dimensions not in (self.matryoshka or ()):
            sizes = f"only {', '.join(map(str, self.matryoshka))} or {width}" if self.matryoshka \
                else f"{width}, and it declares no shorter ones (is_matryoshka, matryoshka_dimensions)"
            raise ValueError(f"dimensions={dimensions}: this model's embeddings have {sizes}")
        short = vector[:dimensions]
        return short / max(float(np.linalg.norm(short)), 1e-12) if self.normalize else short.copy()


def pooling_of(model_path: str | os.PathLike, gguf_metadata: dict | None = None) -> Pooling:
    """The model's pooling (the module's docstring); gguf_metadata: a GGUF file's."""
    pooling = _pooling_mode_of(os.fspath(model_path), gguf_metadata)
    return replace(pooling, matryoshka=_matryoshka(os.fspath(model_path)))


def _matryoshka(model_path: str) -> bool | tuple:
    """config.json's is_matryoshka / matryoshka_dimensions (False: neither)."""
    path = os.path.join(model_path, "config.json")
    if not os.path.isfile(path):
        return False
    with open(path, encoding="utf-8") as f:
        config = json.load(f)
    sizes = config.get("matryoshka_dimensions")
    if sizes is not None:
        if not isinstance(sizes, list) or not all(isinstance(d, int) and d > 0 for d in sizes):
            raise ValueError(f"{path}: matryoshka_dimensions must be a list of positive "
                             f"integers, got {sizes!r}")
        return tuple(sizes)
    return config.get("is_matryoshka") is True


def _pooling_mode_of(model_path: str, gguf_metadata: dict | None) -> Pooling:
    if gguf_metadata is not None:
        arch = gguf_metadata.get("general.architecture", "")
        kind = gguf_metadata.get(f"{arch}.pooling_type")
        if kind is None:
            return Pooling()
        if int(kind) not in GGUF_POOLING:
            raise ValueError(f"{model_path}: {arch}.pooling_type={kind} is not a pooling "
                             f"tinypaged computes (1 mean, 2 cls, 3 last)")
        return Pooling(GGUF_POOLING[int(kind)], True, "gguf")
    modules_path = os.path.join(model_path, "modules.json")
    if not os.path.isfile(modules_path):
        return Pooling()
    with open(modules_path, encoding="utf-8") as f:
        modules = json.load(f)
    mode, normalize = None, False
    for module in modules:
        kind = str(module.get("type", "")).rsplit(".", 1)[-1]
        if kind == "Pooling":
            mode = _st_pooling_mode(os.path.join(model_path, module.get("path", ""), "config.json"))
        elif kind == "Normalize":
            normalize = True
        elif kind != "Transformer":
            raise ValueError(f"{modules_path}: module {module.get('type')!r} is not one "
                             f"tinypaged computes (it takes Transformer, Pooling, Normalize)")
    if mode is None:
        raise ValueError(f"{modules_path}: no Pooling module, so no way to one embedding")
    return Pooling(mode, normalize, "sentence-transformers")


def _st_pooling_mode(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        config = json.load(f)
    if "pooling_mode" in config:  # (sentence-transformers >= 5)
        mode = config["pooling_mode"]
        if mode not in _ST_MODES:
            raise ValueError(f"{path}: pooling_mode {mode!r} is not one tinypaged computes "
                             f"({', '.join(_ST_MODES)})")
        return _ST_MODES[mode]
    on = [flag for flag in (*_ST_FLAGS, *_ST_OTHER_FLAGS) if config.get(flag)]
    if len(on) != 1 or on[0] not in _ST_FLAGS:
        raise ValueError(f"{path}: pooling {', '.join(on) or 'none'} is not one tinypaged "
                         f"computes (one of {', '.join(_ST_FLAGS)})")
    return _ST_FLAGS[on[0]]
