"""GGUF metadata -> a HF config.json dict, by the same rule as config.json: every
`<arch>.*` key is read, ignored on purpose, or refused by name.

llama.cpp's converter writes the model's shape under `<arch>.` (llama, qwen2...), the
tokenizer under `tokenizer.` (gguf_tokenizer.py reads those) and provenance under
`general.` (name, license, quantization: nothing that changes the math, but for
general.architecture). RoPE scaling appears as `<arch>.rope.scaling.*` (linear,
YaRN) or, for Llama 3's, as the tensor rope_freqs.weight (gguf_model.py).
"""
from __future__ import annotations

from ..formats.gguf import GGUFFile

from .families import FAMILIES
from .gguf_names import GLOBAL_TENSORS, LAYER_TENSORS

# general.architecture -> (the HF architecture it reads as, what the family reads of it)
ARCHITECTURES = {f.gguf.name: f for f in FAMILIES.values() if f.gguf is not None}


def hf_name(gguf_name: str, arch: str) -> str | None:
    """HF tensor name for a GGUF tensor name of architecture arch, or None for a
    tensor nothing reads."""
    if gguf_name in GLOBAL_TENSORS:
        return GLOBAL_TENSORS[gguf_name]
    parts = gguf_name.split(".", 2)  # blk.N.rest
    layer = {**LAYER_TENSORS, **ARCHITECTURES[arch].gguf.tensors} if arch in ARCHITECTURES else LAYER_TENSORS
    if len(parts) == 3 and parts[0] == "blk" and parts[2] in layer:
        return f"model.layers.{parts[1]}.{layer[parts[2]]}"
    return None


# <arch>.<key>s every architecture's reading below reads
READ = {"context_length", "embedding_length", "block_count", "feed_forward_length",
        "attention.head_count", "attention.head_count_kv", "attention.layer_norm_rms_epsilon",
        "rope.freq_base", "rope.dimension_count", "attention.key_length",
        "attention.value_length", "vocab_size", "rope.scaling.type", "rope.scaling.factor",
        "rope.scaling.original_context_length", "rope.scaling.attn_factor",
        "rope.scaling.yarn_beta_fast", "rope.scaling.yarn_beta_slow", "expert_count",
        "expert_used_count"}
# <arch>.<key>s that change nothing the forward computes (pooling_type: how an embedding
# pools the hidden states, which model/pooling.py reads)
IGNORED = {"rope.scaling.finetuned", "tensor_data_layout", "pooling_type"}


def check_metadata_keys(gguf: GGUFFile, arch: str) -> None:
    known = READ | IGNORED | ARCHITECTURES[arch].gguf.keys
    unknown = sorted(key for key in gguf.metadata
                     if key.startswith(arch + ".") and key[len(arch) + 1:] not in known)
    if unknown:
        raise ValueError(f"{gguf.path}: GGUF metadata {', '.join(unknown)}: "
                         f"{'a key' if len(unknown) == 1 else 'keys'} tinypaged does not read, "
                         f"which may change the model's output, so the model is refused")


def gguf_model_config(gguf: GGUFFile) -> dict:
    """A HF config.json dict from GGUF metadata; a value of the wrong type is a
    ValueError naming the file and the key (ModelConfig then checks the values)."""
    arch = gguf.require("general.architecture")
    if arch not in ARCHITECTURES:
        raise ValueError(f"{gguf.path}: GGUF architecture {arch!r} is not supported "
                         f"(supported: {', '.join(ARCHITECTURES)})")
    check_metadata_keys(gguf, arch)
    n_heads = gguf.integer(f"{arch}.attention.head_count")
    hidden = gguf.integer(f"{arch}.embedding_length")
    if n_heads < 1:
        raise ValueError(f"{gguf.path}: {arch}.attention.head_count={n_heads} must be >= 1")
    if gguf.integer(f"{arch}.expert_count", 0):
        raise ValueError(f"{gguf.path}: {arch}.expert_count={gguf.get(f'{arch}.expert_count')}: "
                         f"mixture-of-experts models are not supported")
    head_dim = gguf.integer(f"{arch}.attention.key_length", hidden // n_heads)
    for key in ("attention.value_length", "rope.dimension_count"):
        value = gguf.integer(f"{arch}.{key}", head_dim)
        if value != head_dim:
            what = "RoPE over part of each head" if key.startswith("rope") else \
                "values of another width than keys"
            raise ValueError(f"{gguf.path}: {arch}.{key}={value} with heads of {head_dim} "
                             f"({what}) is not supported")
    tokens = gguf.require("tokenizer.ggml.tokens")
    config = {
        "architectures": [ARCHITECTURES[arch].name],
        "model_type": arch,
        "vocab_size": gguf.integer(f"{arch}.vocab_size", len(tokens)),
        "hidden_size": hidden,
        "intermediate_size": gguf.integer(f"{arch}.feed_forward_length"),
        "num_hidden_layers": gguf.integer(f"{arch}.block_count"),
        "num_attention_heads": n_heads,
        "num_key_value_heads": gguf.integer(f"{arch}.attention.head_count_kv", n_heads),
        "head_dim": head_dim,
        "max_position_embeddings": gguf.integer(f"{arch}.context_length", 2048),
        # GGUF keeps eps as float32: print it back as the short decimal it came from
        "rms_norm_eps": float(f"{gguf.number(f'{arch}.attention.layer_norm_rms_epsilon', 1e-5):.7g}"),
        "rope_theta": gguf.number(f"{arch}.rope.freq_base", 10000.0),
        "tie_word_embeddings": "output.weight" not in gguf.tensors,
        "torch_dtype": "float16",
    }
    config.update(ARCHITECTURES[arch].gguf.config(gguf, arch, config))
    scaling = rope_scaling(gguf, arch)
    if scaling:
        config["rope_scaling"] = scaling
    if arch in ("llama", "smollm3") and \
            all(f"blk.0.attn_{n}.bias" in gguf.tensors for n in ("q", "k", "v", "output")):
        config["attention_bias"] = True
    for key in ("bos_token_id", "eos_token_id"):
        if gguf.get(f"tokenizer.ggml.{key}") is not None:
            config[key] = gguf.integer(f"tokenizer.ggml.{key}")
    return config


def rope_scaling(gguf: GGUFFile, arch: str) -> dict | None:
    """The older config layout's rope_scaling for <arch>.rope.scaling.* (None: none)."""
    kind = gguf.get(f"{arch}.rope.scaling.type", "none")
    if kind == "none":
        return None
    if kind not in ("linear", "yarn"):
        raise ValueError(f"{gguf.path}: {arch}.rope.scaling.type={kind!r} is not supported "
                         f"(linear and yarn are)")
    factor = gguf.number(f"{arch}.rope.scaling.factor", 0.0)
    if factor <= 0:
        raise ValueError(f"{gguf.path}: {arch}.rope.scaling.factor={factor:g} must be positive")
    # llama.cpp multiplies its own YaRN scale by attn_factor; transformers replaces it
    attn_factor = gguf.number(f"{arch}.rope.scaling.attn_factor", 1.0)
    if attn_factor != 1.0:
        raise ValueError(f"{gguf.path}: {arch}.rope.scaling.attn_factor={attn_factor:g} is not "
                         f"supported (only 1)")
    scaling = {"rope_type": kind, "factor": factor}
    if kind == "yarn":
        original = gguf.integer(f"{arch}.rope.scaling.original_context_length", 0)
        if original <= 0:
            raise ValueError(f"{gguf.path}: YaRN needs {arch}.rope.scaling.original_context_length "
                             f"(a positive integer)")
        scaling["original_max_position_embeddings"] = original
        scaling["beta_fast"] = gguf.number(f"{arch}.rope.scaling.yarn_beta_fast", 32.0)
        scaling["beta_slow"] = gguf.number(f"{arch}.rope.scaling.yarn_beta_slow", 1.0)
    return scaling
