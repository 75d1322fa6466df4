"""A model file read whole: a HF folder or a GGUF file, to (config, checked weights)
with the load-time folds every backend relies on (a HF folder's norm offset, the
family's own folds: Family.fold) and non-finite values refused."""
from __future__ import annotations

import os

import numpy as np

from .config import ModelConfig
from .gguf_model import load_gguf_model, requantized_matrices
from .weights import load_weights


def load_model(model_dir: str | os.PathLike,
               prepared: dict | None = None) -> tuple[ModelConfig, dict[str, np.ndarray]]:
    """Config and checked weights of a HF model folder (float32; F16 matrices float16)
    or of a GGUF file
    (quantized matrices kept packed: gguf_model.py). prepared: a backend's weights
    kept from an earlier load of this GGUF file (kernels/cpu/weight_cache.py): only
    the config is read, and they are returned as they are."""
    model_dir = os.fspath(model_dir)
    if model_dir.lower().endswith(".gguf"):
        cfg, weights = load_gguf_model(model_dir, with_weights=prepared is None)
        if prepared is not None:
            return cfg, prepared
    elif not os.path.isdir(model_dir):
        raise FileNotFoundError(f"model folder not found: {model_dir}")
    else:
        cfg = ModelConfig.from_json(model_dir)
        weights = offset_norms(load_weights(model_dir, cfg), cfg)
    check_finite(weights, model_dir)
    return cfg, cfg.family.fold(weights, cfg, from_gguf=model_dir.lower().endswith(".gguf"))


def requantized(model_dir: str | os.PathLike) -> dict[str, str]:
    """The matrices loading holds in another kind than the file's, name -> "Q5_0 ->
    Q8_0" (a GGUF's Q5_x rows it cannot keep packed); none for a HF folder."""
    model_dir = os.fspath(model_dir)
    return requantized_matrices(model_dir) if model_dir.lower().endswith(".gguf") else {}


def check_finite(weights: dict, where: str) -> None:
    """The norms and a float embedding table hold only finite values: one NaN there
    makes every logit NaN, and nothing could be sampled. Packed tables are left to
    the step's check of its logits (step_logits.NonFiniteLogits)."""
    for name, w in weights.items():
        if (name.endswith("norm.weight") or name == "model.embed_tokens.weight") \
                and isinstance(w, np.ndarray) and not np.isfinite(w).all():
            raise ValueError(f"{where}: tensor {name!r} holds non-finite values (NaN or "
                             f"infinity); refused rather than run to NaN logits")


def offset_norms(weights: dict, cfg: ModelConfig) -> dict:
    """A HF folder's norms as its family stores them, w - hf_norm_offset (Gemma's
    multiply by 1 + w): the offset added once here (float32), so every backend's
    RMSNorm is the plain one. (llama.cpp's converter adds it when writing a GGUF
    file: GGUF weights come as they are.)"""
    offset = cfg.family.hf_norm_offset
    if offset:
        for name in weights:
            if name.endswith("norm.weight"):
                weights[name] = weights[name].astype(np.float32) + np.float32(offset)
    return weights
