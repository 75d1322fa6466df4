"""Granite: Llama with four multipliers. Embeddings are scaled by
embedding_multiplier, each block's output by residual_multiplier before it joins
the residual stream, the attention scores by attention_multiplier (in place of
1/sqrt(head_dim)), and the logits divided by logits_scaling (folded at load into the
final norm's weight: the logits are lm_head(norm(x)), linear in it)."""
import numpy as np

from .family import Family, attention_biases, no_mlp_bias
from .gguf_names import GGUFArchitecture


def read(get, layers: int) -> dict:
    no_mlp_bias(get)

    def positive(key: str) -> float:
        value = get.number(key, 1.0)
        if value <= 0:
            raise ValueError(f"{get.where}: {key}={value:g} must be positive")
        return value

    return {**attention_biases(get), "embedding_scale": positive("embedding_multiplier"),
            "attention_scale": positive("attention_multiplier"),
            "settings": {"residual_multiplier": positive("residual_multiplier"),
                         "logits_scaling": positive("logits_scaling")}}


def layer(p, x, residual):
    """Llama's, each block's output scaled as it joins the stream."""
    scale = p.cfg.settings["residual_multiplier"]
    h, residual = p.add_norm(x, residual, "input_layernorm")
    x = p.scale(p.attention(h), scale)
    h, residual = p.add_norm(x, residual, "post_attention_layernorm")
    return p.scale(p.mlp(h), scale), residual


def fold(weights: dict, cfg, from_gguf: bool) -> dict:
    """The logits' division, into the final norm's weight (float32)."""
    norm = weights["model.norm.weight"]
    weights["model.norm.weight"] = (norm * np.float32(1.0 / cfg.settings["logits_scaling"])).astype(np.float32)
    return weights


def gguf_config(gguf, arch: str, config: dict) -> dict:
    """The multipliers, as llama.cpp's keys hold them (logit_scale divides; an absent
    attention.scale is llama.cpp's 1/sqrt(head_dim))."""
    def positive(key: str, default: float) -> float:
        value = gguf.number(f"{arch}.{key}", default)
        if value <= 0:
            raise ValueError(f"{gguf.path}: {arch}.{key}={value:g} must be positive")
        return value
    return {"embedding_multiplier": positive("embedding_scale", 1.0),
            "residual_multiplier": positive("residual_scale", 1.0),
            "logits_scaling": positive("logit_scale", 1.0),
            "attention_multiplier": positive("attention.scale", config["head_dim"] ** -0.5)}


GRANITE = Family("GraniteForCausalLM",
                 frozenset({"attention_bias", "mlp_bias", "embedding_multiplier", "logits_scaling",
                            "residual_multiplier", "attention_multiplier"}), read,
                 gguf=GGUFArchitecture("granite", True, {},
                                       frozenset({"embedding_scale", "residual_scale", "logit_scale",
                                                  "attention.scale"}), gguf_config),
                 layer=layer, fold=fold)
