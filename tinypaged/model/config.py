"""ModelConfig: the shape of a decoder-only transformer, read from HF `config.json`."""
from __future__ import annotations

import json
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
    def from_dict(cls, cfg: dict) -> "ModelConfig":
        archs = cfg.get("architectures") or []
        if not archs:
            raise ValueError("config.json has no 'architectures' entry")
        arch = archs[0]
        if arch not in SUPPORTED_ARCHITECTURES:
            raise ValueError(f"architecture {arch!r} is not supported "
                             f"(supported: {', '.join(SUPPORTED_ARCHITECTURES)})")
        act = cfg.get("hidden_act", "silu")
        if act != "silu":
            raise ValueError(f"hidden_act={act!r} is not supported (only 'silu')")
        if cfg.get("rope_scaling"):
            raise ValueError(f"rope_scaling={cfg['rope_scaling']!r} is not supported yet")
        if cfg.get("mlp_bias"):
            raise ValueError("mlp_bias=true is not supported")
        try:
            eos = cfg.get("eos_token_id")
            return cls(
                architecture=arch,
                vocab_size=int(cfg["vocab_size"]),
                hidden_size=int(cfg["hidden_size"]),
                intermediate_size=int(cfg["intermediate_size"]),
                num_hidden_layers=int(cfg["num_hidden_layers"]),
                num_attention_heads=int(cfg["num_attention_heads"]),
                num_key_value_heads=int(cfg.get("num_key_value_heads")
                                        or cfg["num_attention_heads"]),
                head_dim=int(cfg.get("head_dim") or 0),
                max_position_embeddings=int(cfg.get("max_position_embeddings", 2048)),
                rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
                rope_theta=float(cfg.get("rope_theta", 10000.0)),
                tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
                attention_bias=bool(cfg.get("attention_bias", SUPPORTED_ARCHITECTURES[arch])),
                bos_token_id=cfg.get("bos_token_id"),
                eos_token_ids=[] if eos is None else list(eos) if isinstance(eos, list) else [eos],
            )
        except KeyError as e:
            raise ValueError(f"config.json is missing the required key {e.args[0]!r}") from None
        except (TypeError, ValueError) as e:
            if isinstance(e, ValueError) and "config" in str(e):
                raise
            raise ValueError(f"config.json has a value of the wrong type: {e}") from None

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
        return cls.from_dict(cfg)
