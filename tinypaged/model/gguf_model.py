"""A GGUF file as a model, without conversion: config from its metadata, weights
from the memory-mapped tensors, quantized matrices kept packed (PackedWeight).

Every weight is a copy, and each tensor's file pages are released once copied,
so the weights are resident once (the file stays mapped for the tokenizer).
Q8_0 / Q4_0 / Q4_1 / Q5_0 / Q5_1 and K-quant (Q4_K / Q5_K / Q6_K) matrices become
PackedWeights (the same bytes, split into quants, scales and high bits; packed.py
says why). A Q5_x matrix whose rows are an odd number of blocks is requantized to
Q8_0 (1.06 bytes a weight, against 0.69-0.75 on file). F32 / F16 / BF16 tensors,
the norms, and a Q4 matrix whose rows are not a multiple of 64 are read as float32.
llama.cpp stores Llama's Q and K rows permuted for the interleaved RoPE form (their
biases too): the rows are put back in rotate-half order here, on the packed rows (a
row of blocks moves as a whole).
"""
from __future__ import annotations

import os
from dataclasses import replace

import numpy as np

from ..formats.gguf import GGUFFile, unpermute_rows
from ..formats.packed import PackedWeight
from ..formats.quant_kind import GGML_TYPE_NAMES, REQUANTIZE_TO, REQUANTIZED
from .config import ModelConfig
from .gguf_config import ARCHITECTURES, gguf_model_config, hf_name
from .weights import (check_consumed, check_layer_count, check_weights, expected_shapes,
                      file_shapes, split_fused)

ROPE_FREQS = "rope_freqs.weight"  # Llama 3's RoPE scaling, as llama.cpp writes it


SLAB_BYTES = 16 << 20  # file bytes a packed matrix is read in at a time


def _packed_in_slabs(gguf, name: str, info) -> PackedWeight:
    """A packed matrix read SLAB_BYTES of rows at a time, each slab's file pages
    released once copied, so a 171 MB embedding (Gemma 3's) is never in memory twice,
    as file pages and as the copy, while it loads."""
    n, k = info.shape
    raw = gguf.raw(name)
    row_bytes = info.nbytes // n
    rows_at_once = max(1, SLAB_BYTES // row_bytes)
    arrays, kind = None, info.ggml_type
    for r0 in range(0, n, rows_at_once):
        r1 = min(n, r0 + rows_at_once)
        part = PackedWeight.from_bytes(raw[r0 * row_bytes:r1 * row_bytes], info.ggml_type, (r1 - r0, k))
        if arrays is None:  # (the slab's kind: a test's from_bytes may requantize)
            kind = part.kind
            arrays = [None if a is None else np.empty((n, *a.shape[1:]), a.dtype) for a in part.arrays()]
        for whole, piece in zip(arrays, part.arrays()):
            if piece is not None:
                whole[r0:r1] = piece
        gguf.release(name, r0 * row_bytes, (r1 - r0) * row_bytes)
    return PackedWeight(kind, (n, k), *arrays)


def _requantized(info) -> bool:
    """Whether loading holds this tensor as Q8_0 instead of its file's kind: a Q5_x
    matrix PackedWeight cannot keep (rows of an odd number of blocks)."""
    return len(info.shape) == 2 and info.ggml_type in REQUANTIZED \
        and not PackedWeight.can_pack(info.ggml_type, info.shape[1])


def requantized_matrices(path: str | os.PathLike) -> dict[str, str]:
    """HF name -> "Q5_0 -> Q8_0" for each matrix of a GGUF file that loading rounds to
    another kind than the file's (read from the tensor table alone)."""
    gguf = GGUFFile.open(path)
    arch = gguf.require("general.architecture")
    return {hf_name(name, arch): f"{GGML_TYPE_NAMES[info.ggml_type]} -> {GGML_TYPE_NAMES[REQUANTIZE_TO]}"
            for name, info in gguf.tensors.items() if _requantized(info)}


def load_gguf_model(path: str | os.PathLike, with_weights: bool = True) -> tuple[ModelConfig, dict | None]:
    """(config, weights) of a GGUF file: HF tensor names, checked shapes. Without
    weights: (config, None), every check made on the tensors' names and shapes, no
    tensor data read but the small ones the config takes (rope_freqs)."""
    gguf = GGUFFile.open(path)
    cfg = ModelConfig.from_dict(gguf_model_config(gguf), gguf.path)
    arch = gguf.require("general.architecture")
    permuted = ARCHITECTURES[arch].gguf.permuted
    heads = {"attn_q.weight": cfg.num_attention_heads, "attn_k.weight": cfg.num_key_value_heads,
             "attn_q.bias": cfg.num_attention_heads, "attn_k.bias": cfg.num_key_value_heads}
    # a GGUF file says which biases it has by holding them (layer 0 speaks for all)
    cfg.attention_bias = cfg.attention_bias or any(f"blk.0.attn_{n}.bias" in gguf.tensors for n in "qkv")
    cfg.o_proj_bias = "blk.0.attn_output.bias" in gguf.tensors
    if ROPE_FREQS in gguf.tensors:
        factors = gguf.load(ROPE_FREQS)
        if factors.shape != (cfg.head_dim // 2,) or not np.all(np.isfinite(factors) & (factors > 0)):
            raise ValueError(f"{gguf.path}: {ROPE_FREQS} must hold {cfg.head_dim // 2} positive "
                             f"factors, got shape {list(factors.shape)}")
        cfg.rope = replace(cfg.rope, freq_factors=tuple(float(f) for f in factors))
    unmapped = [name for name in gguf.tensors if hf_name(name, arch) is None and name != ROPE_FREQS]
    if unmapped:
        shown = ", ".join(map(repr, unmapped[:4])) + (f" and {len(unmapped) - 4} more" if len(unmapped) > 4 else "")
        raise ValueError(f"{gguf.path}: the file holds {shown}, which tinypaged's "
                         f"{cfg.architecture} does not read; refused rather than run without")
    targets = {name: hf_name(name, arch) for name in gguf.tensors if name != ROPE_FREQS}
    check_layer_count(targets.values(), cfg, gguf.path)  # (first: the shapes are per layer)
    expected = file_shapes(cfg)
    check_consumed(targets.values(), cfg, gguf.path, expected)
    for name, target in targets.items():
        info = gguf.tensors[name]
        if tuple(info.shape) != expected[target]:
            raise ValueError(f"{gguf.path}: tensor {name!r} has shape {list(info.shape)}, "
                             f"the metadata implies {list(expected[target])}")
    if not with_weights:
        return cfg, None
    weights = {}
    for name, target in targets.items():
        info = gguf.tensors[name]
        if len(info.shape) == 2 and PackedWeight.can_pack(info.ggml_type, info.shape[1]):
            w = _packed_in_slabs(gguf, name, info)
        elif _requantized(info):  # rows of 32k: whole Q8_0 blocks; our kernels read Q8_0
            w = PackedWeight.quantize(gguf.load(name), REQUANTIZE_TO)
        else:  # float32 (a copy: an F32 tensor would be a view of the file); an
            w = np.array(gguf.load(name), dtype=np.float32)  # unsupported type is named here
        suffix = name.split(".", 2)[-1]
        if permuted and suffix in heads:
            order = unpermute_rows(np.arange(info.shape[0]), heads[suffix])
            w = w.take_rows(order) if isinstance(w, PackedWeight) else w[order]
        weights[target] = w
        gguf.release(name)  # every weight is a copy: the file's pages can go
    if cfg.fused_projections:
        weights = split_fused(weights, cfg)
    check_weights(weights, cfg, gguf.path)
    weights = {name: weights[name] for name in expected_shapes(cfg)}
    if cfg.tie_word_embeddings:
        weights["lm_head.weight"] = weights["model.embed_tokens.weight"]
    return cfg, weights
