"""GGUF file -> Hugging Face model folder (config.json, model.safetensors, tokenizer files).

Tensors are dequantised to float32 and stored as float16 (float32 where a value
would overflow float16). llama.cpp stores Llama's Q and K projection rows
permuted for the interleaved RoPE form; we undo that so the folder uses HF's
rotate-half order like every other HF checkpoint.
"""
from __future__ import annotations

import json
import os
import shutil
from typing import Callable

import numpy as np
from safetensors.numpy import save_file

from ..formats.gguf import GGUFFile, unpermute_rows
from ..formats.quant_kind import BLOCK_LAYOUT
from .config import ModelConfig
from .gguf_config import ARCHITECTURES, gguf_model_config, hf_name
from .weights import check_consumed, check_weights

F16_MAX = float(np.finfo(np.float16).max)


def convert_gguf(path: str | os.PathLike, out_dir: str | os.PathLike,
                 log: Callable[[str], None] = lambda msg: None) -> None:
    """Write the HF folder `out_dir` (which must not exist yet) from GGUF file `path`."""
    out_dir = os.fspath(out_dir)
    if os.path.exists(out_dir) and os.listdir(out_dir):
        raise ValueError(f"output folder {out_dir} already exists and is not empty")
    gguf = GGUFFile(path)
    config = gguf_model_config(gguf)
    cfg = ModelConfig.from_dict(config)
    arch = gguf.require("general.architecture")
    unmapped = [name for name in gguf.tensors if hf_name(name, arch) is None]
    if unmapped:
        raise ValueError(f"{path}: tensor {unmapped[0]!r} has no place in a HF {cfg.architecture} "
                         f"folder (load the GGUF file itself instead)")
    wanted = {name: hf_name(name, arch) for name in gguf.tensors}
    for name in wanted:  # reject unsupported quantisation before doing any work
        if gguf.tensors[name].ggml_type not in BLOCK_LAYOUT:
            gguf.load(name)  # raises ValueError naming the type

    permuted = ARCHITECTURES[arch].gguf.permuted
    tensors: dict[str, np.ndarray] = {}
    for i, (name, target) in enumerate(wanted.items()):
        w = gguf.load(name)
        if permuted and name.endswith(("attn_q.weight", "attn_q.bias")):
            w = unpermute_rows(w, cfg.num_attention_heads)
        elif permuted and name.endswith(("attn_k.weight", "attn_k.bias")):
            w = unpermute_rows(w, cfg.num_key_value_heads)
        if cfg.family.hf_norm_offset and target.endswith("norm.weight"):
            w = w - np.float32(cfg.family.hf_norm_offset)  # a HF folder stores Gemma's norms as w - 1
        tensors[target] = w.astype(np.float16) if np.abs(w).max() <= F16_MAX else w
        if (i + 1) % 50 == 0 or i + 1 == len(wanted):
            log(f"dequantised {i + 1}/{len(wanted)} tensors")
    check_weights(tensors, cfg, os.fspath(path))
    check_consumed(tensors, cfg, os.fspath(path))

    partial = out_dir.rstrip("/\\") + ".partial"
    shutil.rmtree(partial, ignore_errors=True)
    os.makedirs(partial)
    try:
        save_file(tensors, os.path.join(partial, "model.safetensors"),
                  metadata={"format": "pt", "source": os.path.basename(os.fspath(path))})
        with open(os.path.join(partial, "config.json"), "w", encoding="utf-8") as f:
            json.dump(config, f, indent=2)
        from ..formats.gguf_tokenizer import write_tokenizer_files  # (imports `tokenizers`)
        write_tokenizer_files(gguf, partial)
        if os.path.isdir(out_dir):
            os.rmdir(out_dir)  # empty, checked above
        os.replace(partial, out_dir)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    log(f"wrote {out_dir}")
