"""Gemma 3 (text): Gemma 2's sandwich norms and query_pre_attn_scalar, with an
RMSNorm over each head of q and k (1 + w, as Gemma's), five sliding layers to one
global (layer i slides unless (i + 1) % sliding_window_pattern == 0; layer_types in
newer configs), and a RoPE of its own for each kind: the sliding layers' base is
rope_local_base_freq (10,000), the global layers' rope_theta (1,000,000) with the
config's scaling. transformers >= 5 nests rope_parameters by layer type. Soft-capping
is off unless the config sets it."""
from ..kernels.rope import rope_from_config, rope_from_parameters
from .family import Family, layer_types, window
from .gemma import GGUF_KEYS, gelu_tanh, gemma_basics, gguf_config, optional_positive
from .gguf_names import QK_NORMS, SANDWICH, GGUFArchitecture
from .layer import sandwich

GLOBAL_THETA, LOCAL_THETA = 1_000_000.0, 10_000.0


def ropes(get) -> dict:
    """rope (the global layers') and local_rope (the sliding layers'), from either layout."""
    max_positions = get.integer("max_position_embeddings", 131_072)
    nested = get.cfg.get("rope_parameters")
    if isinstance(nested, dict) and set(nested) <= {"full_attention", "sliding_attention"} and nested:
        def one(kind: str, theta: float):
            params = nested.get(kind) or {}
            if not isinstance(params, dict):
                raise ValueError(f"{get.where}: rope_parameters[{kind!r}] must be an object")
            params = {"rope_theta": theta, **params}
            return rope_from_parameters(params, get.where, max_positions, f"rope_parameters[{kind!r}]")
        return {"rope": one("full_attention", GLOBAL_THETA),
                "local_rope": one("sliding_attention", LOCAL_THETA)}
    config = dict(get.cfg)
    config.setdefault("rope_theta", GLOBAL_THETA)
    local = get.number("rope_local_base_freq", LOCAL_THETA)
    if local <= 0:
        raise ValueError(f"{get.where}: rope_local_base_freq={local:g} must be positive")
    return {"rope": rope_from_config(config, get.where, max_positions),
            "local_rope": rope_from_parameters({"rope_theta": local}, get.where, max_positions)}


def read(get, layers: int) -> dict:
    gelu_tanh(get, ("hidden_act", "hidden_activation"))
    scalar = get.number("query_pre_attn_scalar", 256)
    if scalar <= 0:
        raise ValueError(f"{get.where}: query_pre_attn_scalar={scalar:g} must be positive")
    pattern = get.integer("sliding_window_pattern", get.cfg.get("_sliding_window_pattern", 6),
                          positive=True)
    return {**gemma_basics(get), "attention_scale": scalar ** -0.5, "sliding_window": window(get),
            "layer_types": layer_types(get, layers, ["sliding_attention" if (i + 1) % pattern else
                                                     "full_attention" for i in range(layers)]),
            "attn_softcap": optional_positive(get, "attn_logit_softcapping", None),
            "final_softcap": optional_positive(get, "final_logit_softcapping", None),
            **ropes(get)}


def layer(p, x, residual):  # Gemma 2's, each head of q and k normed (by 1 + w)
    return sandwich(p, x, residual, qk_norm="head", activation="gelu_tanh")


GEMMA3 = Family("Gemma3ForCausalLM",
                frozenset({"attention_bias", "hidden_activation", "use_bidirectional_attention",
                           "query_pre_attn_scalar", "sliding_window", "sliding_window_pattern",
                           "layer_types", "attn_logit_softcapping", "final_logit_softcapping",
                           "rope_local_base_freq", "cache_implementation"}),
                read, reads_activation=True,
                # five local layers to one global; the local RoPE base is 10,000
                gguf=GGUFArchitecture("gemma3", False, {**SANDWICH, **QK_NORMS}, GGUF_KEYS,
                                      lambda gguf, arch, config: {
                                          **gguf_config(gguf, arch, config), "sliding_window_pattern": 6,
                                          "rope_local_base_freq": LOCAL_THETA}),
                layer=layer, hf_norm_offset=1.0)
