"""Gemma (1): Llama with a GeGLU MLP (GELU's tanh form), RMSNorm weights stored as
w - 1 (the norm multiplies by 1 + w; the loader adds the 1, weights.py), and
embeddings scaled by sqrt(hidden_size). The helpers serve Gemma 2 and 3 too."""
from .family import Family, attention_biases

GELU_TANH = "gelu_pytorch_tanh"


def gemma_basics(get) -> dict:
    """What every Gemma shares."""
    if get.boolean("use_bidirectional_attention", False):
        raise ValueError(f"{get.where}: use_bidirectional_attention=true (an encoder's "
                         f"attention) is not supported")
    hidden = get.integer("hidden_size", positive=True)
    return {**attention_biases(get), "activation": "gelu_tanh", "norm_offset": 1.0,
            "embedding_scale": hidden ** 0.5}


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


GEMMA = Family("GemmaForCausalLM",
               frozenset({"attention_bias", "hidden_activation", "use_bidirectional_attention"}),
               read, reads_activation=True)
