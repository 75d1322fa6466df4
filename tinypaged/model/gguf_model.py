"""A GGUF file as a model, without conversion: config from its metadata, weights
from the memory-mapped tensors, quantized matrices kept packed (PackedWeight).

Every weight is a copy, and each tensor's file pages are released once copied,
so the weights are resident once (the file stays mapped for the tokenizer).
Q8_0 / Q4_0 / Q4_1 matrices become PackedWeights (the same bytes, split into
quants and scales; packed.py says why). K-quant matrices (Q4_K, Q5_K, Q6_K) are
requantized to Q8_0 (1.06 bytes a weight, against 0.56-0.82 on file). F32 / F16 /
BF16 tensors, the norms, and a Q4 matrix whose rows are not a multiple of 64 are
read as float32. llama.cpp stores Llama's Q and K rows permuted for the
interleaved RoPE form: the rows are put back in rotate-half order here, on the
packed rows (a row of blocks moves as a whole).
"""
from __future__ import annotations

import os

import numpy as np

from .config import ModelConfig
from .gguf import GGUFFile
from .gguf_convert import ARCHITECTURES, gguf_model_config, hf_name, unpermute_rows
from .ggml_quant import K_QUANTS, Q8_0
from .packed import PackedWeight
from .weights import check_layer_count, check_weights, expected_shapes


def load_gguf_model(path: str | os.PathLike) -> tuple[ModelConfig, dict]:
    """(config, weights) of a GGUF file: HF tensor names, checked shapes."""
    gguf = GGUFFile(path)
    cfg = ModelConfig.from_dict(gguf_model_config(gguf), gguf.path)
    permuted = ARCHITECTURES[gguf.require("general.architecture")][1]
    heads = {"attn_q.weight": cfg.num_attention_heads, "attn_k.weight": cfg.num_key_value_heads}
    expected = expected_shapes(cfg)
    targets = {name: hf_name(name) for name in gguf.tensors if hf_name(name) is not None}
    check_layer_count(targets.values(), cfg, gguf.path)
    weights = {}
    for name, target in targets.items():
        info = gguf.tensors[name]
        if target not in expected:  # e.g. q/k/v biases of a model that uses none
            continue
        if tuple(info.shape) != expected[target]:
            raise ValueError(f"{gguf.path}: tensor {name!r} has shape {list(info.shape)}, "
                             f"the metadata implies {list(expected[target])}")
        if len(info.shape) == 2 and PackedWeight.can_pack(info.ggml_type, info.shape[1]):
            w = PackedWeight.from_bytes(gguf.raw(name), info.ggml_type, info.shape)
        elif len(info.shape) == 2 and info.ggml_type in K_QUANTS:  # rows of 256: whole Q8_0
            w = PackedWeight.quantize(gguf.load(name), Q8_0)  # blocks; our kernels read Q8_0
        else:  # float32 (a copy: an F32 tensor would be a view of the file); an
            w = np.array(gguf.load(name), dtype=np.float32)  # unsupported type is named here
        suffix = name.split(".", 2)[-1]
        if permuted and suffix in heads:
            order = unpermute_rows(np.arange(info.shape[0]), heads[suffix])
            w = w.take_rows(order) if isinstance(w, PackedWeight) else w[order]
        weights[target] = w
        gguf.release(name)  # every weight is a copy: the file's pages can go
    check_weights(weights, cfg, gguf.path)
    weights = {name: weights[name] for name in expected_shapes(cfg)}
    if cfg.tie_word_embeddings:
        weights["lm_head.weight"] = weights["model.embed_tokens.weight"]
    return cfg, weights
