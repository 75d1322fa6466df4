"""Family: one architecture, all in one place: the config.json keys it reads beyond
those every family shares (config.COMMON_KEYS), its decoder layer (built from
layer.py's pieces), what it folds into its weights at load, and how llama.cpp's GGUF
files hold it (GGUFArchitecture).

Llama, Mistral and Qwen2 are here (they differ in biases and windows only); every
other family is a small file beside this one, registered in families.py. A new
family is its file and a line there.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from .gguf_names import GGUFArchitecture
from .layer import pre_norm

LAYER_TYPES = ("full_attention", "sliding_attention")


def no_fold(weights: dict, cfg, from_gguf: bool) -> dict:
    return weights


@dataclass(frozen=True)
class Family:
    name: str  # as config.json's "architectures" names it
    keys: frozenset  # the config keys it reads beyond config.COMMON_KEYS
    read: Callable  # (reader: config._Reader, layers: int) -> {ModelConfig field: value}
    reads_activation: bool = False  # else hidden_act must be silu (config.py checks)
    gguf: GGUFArchitecture | None = None  # how llama.cpp's files hold it (gguf_names.py)
    layer: Callable = pre_norm  # (pieces, x, residual) -> (x, residual): layer.py
    # (weights, cfg, from_gguf) -> weights: what loading folds into them (Granite's logit
    # scale into the final norm), so that no op runs for it
    fold: Callable = no_fold
    hf_norm_offset: float = 0.0  # a HF folder stores its norms as w - this (Gemma: 1)


def no_mlp_bias(get) -> None:
    if get.boolean("mlp_bias", False):
        raise ValueError(f"{get.where}: mlp_bias=true (biases on the MLP's projections) "
                         f"is not supported")


def attention_biases(get) -> dict:
    """Llama's attention_bias: a bias on each of q, k, v and o."""
    bias = get.boolean("attention_bias", False)
    return {"attention_bias": bias, "o_proj_bias": bias}


def window(get) -> int | None:
    value = get.integer("sliding_window", None)
    if value is not None and value <= 0:
        raise ValueError(f"{get.where}: sliding_window={value} must be positive")
    return value


def layer_types(get, layers: int, default: list[str]) -> tuple[str, ...]:
    """layer_types as written (transformers >= 5), else default (older configs)."""
    types = get.cfg.get("layer_types")
    if types is None:
        return tuple(default)
    if not isinstance(types, list) or len(types) != layers or not all(t in LAYER_TYPES for t in types):
        raise ValueError(f"{get.where}: layer_types must list one of {', '.join(LAYER_TYPES)} "
                         f"for each of the {layers} layers, got {types!r}")
    return tuple(types)


def qwen_windows(get, layers: int) -> dict:
    """Qwen2's and Qwen3's windows: only with use_sliding_window, in the layers that
    layer_types names (older configs: from layer max_window_layers on)."""
    size = window(get) if get.boolean("use_sliding_window", False) else None
    first = get.integer("max_window_layers", 28)
    types = layer_types(get, layers, ["sliding_attention" if size is not None and i >= first
                                      else "full_attention" for i in range(layers)])
    return {"sliding_window": size, "layer_types": types}


def _llama(get, layers: int) -> dict:
    no_mlp_bias(get)
    if get.boolean("rope_interleaved", False):  # (nanotron's flag, in SmolLM configs)
        raise ValueError(f"{get.where}: rope_interleaved=true (RoPE on interleaved pairs) is "
                         f"not supported")
    return attention_biases(get)


def _mistral(get, layers: int) -> dict:
    return {"sliding_window": window(get)}


def _qwen2(get, layers: int) -> dict:
    return {"attention_bias": True, **qwen_windows(get, layers)}


LLAMA = Family("LlamaForCausalLM",
               frozenset({"attention_bias", "mlp_bias", "pretraining_tp", "rope_interleaved"}), _llama,
               gguf=GGUFArchitecture("llama", True, {}))  # (llama.cpp writes Mistral as llama)
MISTRAL = Family("MistralForCausalLM", frozenset({"sliding_window"}), _mistral)
QWEN_WINDOW_KEYS = frozenset({"sliding_window", "use_sliding_window", "max_window_layers", "layer_types"})
QWEN2 = Family("Qwen2ForCausalLM", QWEN_WINDOW_KEYS, _qwen2, gguf=GGUFArchitecture("qwen2", False, {}))
