"""Gemma 2: Gemma with norms both before and after each block ("sandwich": input,
post_attention, pre_feedforward and post_feedforward layernorms), a sliding window
in every other layer (the even ones), attention scores scaled by
query_pre_attn_scalar^-0.5 and soft-capped (cap * tanh(score / cap)), and the
logits soft-capped the same way."""
from .family import Family, layer_types, window
from .gemma import GGUF_KEYS, gelu_tanh, gemma_basics, gguf_config, optional_positive
from .gguf_names import SANDWICH, GGUFArchitecture
from .layer import sandwich


def read(get, layers: int) -> dict:
    gelu_tanh(get, ("hidden_act", "hidden_activation"))
    scalar = get.number("query_pre_attn_scalar", 256)
    if scalar <= 0:
        raise ValueError(f"{get.where}: query_pre_attn_scalar={scalar:g} must be positive")
    return {**gemma_basics(get), "attention_scale": scalar ** -0.5,
            "sliding_window": window(get),
            "layer_types": layer_types(get, layers, ["sliding_attention" if (i + 1) % 2 else
                                                     "full_attention" for i in range(layers)]),
            "attn_softcap": optional_positive(get, "attn_logit_softcapping", 50.0),
            "final_softcap": optional_positive(get, "final_logit_softcapping", 30.0)}


def layer(p, x, residual):
    return sandwich(p, x, residual, activation="gelu_tanh")


GEMMA2 = Family("Gemma2ForCausalLM",
                frozenset({"attention_bias", "hidden_activation", "use_bidirectional_attention",
                           "query_pre_attn_scalar", "sliding_window", "layer_types",
                           "attn_logit_softcapping", "final_logit_softcapping",
                           "cache_implementation"}), read, reads_activation=True,
                gguf=GGUFArchitecture("gemma2", False, SANDWICH, GGUF_KEYS, lambda gguf, arch, config: {
                    **gguf_config(gguf, arch, config),
                    "attn_logit_softcapping": gguf.number(f"{arch}.attn_logit_softcapping", 50.0),
                    "final_logit_softcapping": gguf.number(f"{arch}.final_logit_softcapping", 30.0)}),
                layer=layer, hf_norm_offset=1.0)
