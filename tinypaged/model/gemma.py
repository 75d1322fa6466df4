"""Gemma (1): Llama with a GeGLU MLP (GELU's tanh form), RMSNorm weights stored as
w - 1 (the norm multiplies by 1 + w; loading adds the 1: hf_norm_offset), and
embeddings scaled by sqrt(hidden_size). The helpers serve Gemma 2 and 3 too."""
from .family import Family, attention_biases
from .gguf_names import GGUFArchitecture
from .layer import pre_norm

GELU_TANH = "gelu_pytorch_tanh"


def gemma_basics(get) -> dict:
    """What every Gemma shares."""
    if get.boolean("use_bidirectional_attention", False):
        raise ValueError(f"{get.where}: use_bidirectional_attention=true (an encoder's "
                         f"attention) is not supported")
    hidden = get.integer("hidden_size", positive=True)
    return {**attention_biases(get), "embedding_scale": hidden ** 0.5}


def gelu_tanh(get, keys: tuple[str, ...], legacy: tuple[str, ...] = ()) -> None:
    """Each of keys, where set, names GELU's tanh form (legacy: other names that
    transformers reads as it)."""
    for key in keys:
        value = get.cfg.get(key)
        if value is not None and value != GELU_TANH and value not in legacy:
            raise ValueError(f"{get.where}: {key}={value!r} is not supported (only {GELU_TANH!r})")


def optional_positive(get, key: str, default):
    """A key whose explicit null means "off", and whose absence means default."""
    value = get.cfg.get(key, default)
    if value is None:
        return None
    value = get.number(key, 0.0)
    if value <= 0:
        raise ValueError(f"{get.where}: {key}={value:g} must be positive (or null: off)")
    return value


def read(get, layers: int) -> dict:
    # transformers reads the official configs' "gelu" as the tanh form (its warning says so)
    gelu_tanh(get, ("hidden_act", "hidden_activation"), legacy=("gelu",))
    return gemma_basics(get)


def gguf_config(gguf, arch: str, config: dict) -> dict:
    """What llama.cpp fixes for every Gemma rather than writing it: GELU's tanh form;
    the norms' 1 is already added to the file's weights (so: loaded as they are).
    Gemma 2 and 3 also: scores scaled by head_dim^-0.5 (hidden / heads for the 27B
    models: 46 or 62 layers), and the window."""
    out = {"hidden_activation": GELU_TANH}
    if arch in ("gemma2", "gemma3"):
        big = config["num_hidden_layers"] in (46, 62)
        out["query_pre_attn_scalar"] = (config["hidden_size"] // config["num_attention_heads"]
                                        if big else config["head_dim"])
        out["sliding_window"] = gguf.integer(f"{arch}.attention.sliding_window", 4096)
    return out


def layer(p, x, residual):
    return pre_norm(p, x, residual, activation="gelu_tanh")


GGUF_KEYS = frozenset({"attention.sliding_window", "attn_logit_softcapping", "final_logit_softcapping"})
GEMMA = Family("GemmaForCausalLM",
               frozenset({"attention_bias", "hidden_activation", "use_bidirectional_attention"}),
               read, reads_activation=True, gguf=GGUFArchitecture("gemma", False, {}, config=gguf_config),
               layer=layer, hf_norm_offset=1.0)
