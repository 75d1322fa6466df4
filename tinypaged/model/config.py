"""ModelConfig: the shape of a decoder-only transformer, read from HF `config.json`."""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field

# architecture name in config.json -> whether q/k/v projections carry a bias by default
SUPPORTED_ARCHITECTURES = {
    "LlamaForCausalLM": False,
    "MistralForCausalLM": False,
    "Qwen2ForCausalLM": True,
}


@dataclass(slots=True)
class ModelConfig:
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int = 0  # 0: hidden_size // num_attention_heads
    max_position_embeddings: int = 2048
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # bias on q/k/v projections (Qwen2)
    bos_token_id: int | None = None
    eos_token_ids: list[int] = field(default_factory=list)

    def __post_init__(self):
        if self.architecture not in SUPPORTED_ARCHITECTURES:
            raise ValueError(f"architecture {self.architecture!r} is not supported "
                             f"(supported: {', '.join(SUPPORTED_ARCHITECTURES)})")
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                     "num_attention_heads", "num_key_value_heads", "max_position_embeddings"):
            if getattr(self, name) <= 0:
                raise ValueError(f"config {name}={getattr(self, name)} must be positive")
        if self.head_dim == 0:
            if self.hidden_size % self.num_attention_heads:
                raise ValueError(f"hidden_size={self.hidden_size} is not divisible by "
                                 f"num_attention_heads={self.num_attention_heads}")
            self.head_dim = self.hidden_size // self.num_attention_heads
        if self.head_dim % 2:
            raise ValueError(f"head_dim={self.head_dim} must be even for RoPE")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(f"num_attention_heads={self.num_attention_heads} is not a multiple "
                             f"of num_key_value_heads={self.num_key_value_heads}")

    @property
    def q_size(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_key_value_heads * self.head_dim

    @classmethod
    def from_dict(cls, cfg: dict, where: str = "config.json") -> "ModelConfig":
        """Checked: integer fields are JSON integers, token ids lie inside the vocabulary,
        architectures is a list. Errors are ValueErrors naming `where` and the key."""
        archs = cfg.get("architectures")
        if not isinstance(archs, list) or not archs or not all(isinstance(a, str) for a in archs):
            raise ValueError(f"{where}: 'architectures' must be a list of names, e.g. "
                             f"[\"LlamaForCausalLM\"], got {archs!r}")
        arch = archs[0]
        if arch not in SUPPORTED_ARCHITECTURES:
            raise ValueError(f"{where}: architecture {arch!r} is not supported "
                             f"(supported: {', '.join(SUPPORTED_ARCHITECTURES)})")
        act = cfg.get("hidden_act", "silu")
        if act != "silu":
            raise ValueError(f"{where}: hidden_act={act!r} is not supported (only 'silu')")
        if cfg.get("rope_scaling"):
            raise ValueError(f"{where}: rope_scaling={cfg['rope_scaling']!r} is not supported yet")
        if cfg.get("mlp_bias"):
            raise ValueError(f"{where}: mlp_bias=true is not supported")
        get = _Reader(cfg, where)
        vocab = get.integer("vocab_size", positive=True)
        heads = get.integer("num_attention_heads", positive=True)
        try:
            return cls(
                architecture=arch,
                vocab_size=vocab,
                hidden_size=get.integer("hidden_size"),
                intermediate_size=get.integer("intermediate_size"),
                num_hidden_layers=get.integer("num_hidden_layers"),
                num_attention_heads=heads,
                num_key_value_heads=get.integer("num_key_value_heads", heads),
                head_dim=get.integer("head_dim", 0),
                max_position_embeddings=get.integer("max_position_embeddings", 2048),
                rms_norm_eps=get.number("rms_norm_eps", 1e-6),
                rope_theta=get.number("rope_theta", 10000.0),
                tie_word_embeddings=get.boolean("tie_word_embeddings", False),
                attention_bias=get.boolean("attention_bias", SUPPORTED_ARCHITECTURES[arch]),
                bos_token_id=get.token_ids("bos_token_id", vocab, single=True),
                eos_token_ids=get.token_ids("eos_token_id", vocab),
            )
        except ValueError as e:  # ModelConfig's own checks do not know the file
            message = str(e)
            raise ValueError(message if message.startswith(where) else f"{where}: {message}") from None

    @classmethod
    def from_json(cls, path: str | os.PathLike) -> "ModelConfig":
        """Read `path` (a config.json file or a model folder holding one)."""
        path = os.fspath(path)
        if os.path.isdir(path):
            path = os.path.join(path, "config.json")
        if not os.path.isfile(path):
            raise FileNotFoundError(f"model config not found: {path}")
        try:
            with open(path, encoding="utf-8") as f:
                cfg = json.load(f)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: invalid JSON ({e})") from None
        if not isinstance(cfg, dict):
            raise ValueError(f"{path}: expected a JSON object")
        return cls.from_dict(cfg, path)


class _Reader:
    """Typed reads of config.json keys; a missing key takes the default (None or
    null means absent), a required one (no default) is an error."""
    _REQUIRED = object()

    def __init__(self, cfg: dict, where: str):
        self.cfg, self.where = cfg, where

    def _get(self, key: str, default):
        value = self.cfg.get(key)
        if value is None:
            if default is self._REQUIRED:
                raise ValueError(f"{self.where} is missing the required key {key!r}")
            return default, True
        return value, False

    def _wrong(self, key: str, value, kind: str) -> ValueError:
        return ValueError(f"{self.where}: {key} must be {kind}, got {value!r}")

    def integer(self, key: str, default=_REQUIRED, positive: bool = False) -> int:
        value, absent = self._get(key, default)
        if not absent and (not isinstance(value, int) or isinstance(value, bool)):
            raise self._wrong(key, value, "an integer")
        if positive and value <= 0:
            raise ValueError(f"{self.where}: {key}={value} must be positive")
        return value

    def number(self, key: str, default) -> float:
        value, absent = self._get(key, default)
        if not absent and (not isinstance(value, (int, float)) or isinstance(value, bool)
                           or not math.isfinite(value)):
            raise self._wrong(key, value, "a finite number")
        return float(value)

    def boolean(self, key: str, default: bool) -> bool:
        value, absent = self._get(key, default)
        if not absent and not isinstance(value, bool):
            raise self._wrong(key, value, "true or false")
        return value

    def token_ids(self, key: str, vocab_size: int, single: bool = False):
        """A token id (single) or a token id / list of them, each in [0, vocab_size)."""
        value, absent = self._get(key, None)
        if absent:
            return None if single else []
        ids = value if isinstance(value, list) and not single else [value]
        for t in ids:
            if not isinstance(t, int) or isinstance(t, bool) or not 0 <= t < vocab_size:
                raise self._wrong(key, value, f"{'a token id' if single else 'a token id or a list of them'}"
                                             f" in [0, {vocab_size})")
        return ids[0] if single else list(ids)
