"""SmolLM3: Llama with RoPE switched off in some layers (no_rope_layers: 1 where
RoPE is used, 0 where not; by default every no_rope_layer_interval-th layer has
none), and optionally sliding windows (in the layers without RoPE, by default)."""
from .family import Family, attention_biases, layer_types, no_mlp_bias, window
from .gguf_names import GGUFArchitecture


def read(get, layers: int) -> dict:
    no_mlp_bias(get)
    interval = get.integer("no_rope_layer_interval", 4, positive=True)
    uses = get.cfg.get("no_rope_layers")
    if uses is None:
        uses = [int((i + 1) % interval != 0) for i in range(layers)]
    if not isinstance(uses, list) or len(uses) != layers or not all(u in (0, 1) for u in uses):
        raise ValueError(f"{get.where}: no_rope_layers must hold 0 or 1 for each of the "
                         f"{layers} layers, got {uses!r}")
    sliding = get.boolean("use_sliding_window", False)
    size = window(get)
    types = layer_types(get, layers, ["sliding_attention" if sliding and size is not None and not u
                                      else "full_attention" for u in uses])
    return {**attention_biases(get), "rope_layers": tuple(bool(u) for u in uses),
            "sliding_window": size if sliding else None, "layer_types": types}


SMOLLM3 = Family("SmolLM3ForCausalLM",
                 # (max_window_layers: written by some configs, read by nothing in SmolLM3)
                 frozenset({"attention_bias", "mlp_bias", "no_rope_layers", "no_rope_layer_interval",
                            "use_sliding_window", "sliding_window", "layer_types",
                            "max_window_layers"}), read,
                 # llama.cpp fixes the RoPE-less layers at every 4th (n_no_rope_layer_step)
                 gguf=GGUFArchitecture("smollm3", True, {},
                                       config=lambda gguf, arch, config: {"no_rope_layer_interval": 4}))
