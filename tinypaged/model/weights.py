"""Model weights: the expected HF tensor names and shapes, and checked loading."""
from __future__ import annotations

import os
import re

import numpy as np

from ..formats.packed import PackedWeight
from ..formats.safetensors_io import read_model_tensors
from ..formats.weight_dict import LAYER_NAME, convert_matrices
from .config import ModelConfig
from .layer import TensorList


def expected_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """HF tensor name -> shape, for every tensor the forward pass reads: the embedding,
    the final norm, the head, and what each layer of the family's reads (its layer run
    on pieces that only note the tensors: layer.TensorList)."""
    h = cfg.hidden_size
    shapes = {"model.embed_tokens.weight": (cfg.vocab_size, h), "model.norm.weight": (h,)}
    if not cfg.tie_word_embeddings:
        shapes["lm_head.weight"] = (cfg.vocab_size, h)
    for layer in range(cfg.num_hidden_layers):
        tensors = TensorList(cfg, layer)
        cfg.family.layer(tensors, None, None)
        shapes.update(tensors.shapes)
    return shapes


# tensors a file may hold that inference does not need, on purpose: RoPE's inverse
# frequencies, which old checkpoints saved (transformers recomputes them from the
# config, as we do)
_DERIVED = re.compile(r"model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq$")


def check_consumed(names, cfg: ModelConfig, where: str, expected: dict | None = None) -> None:
    """Refuse, by name, a tensor that the forward pass would not read (a bias of a
    model configured without one, a norm of another architecture...): running
    without it would be silently wrong. expected: the names read (expected_shapes')."""
    expected = expected_shapes(cfg) if expected is None else expected
    unused = sorted(name for name in names if name not in expected and not _DERIVED.match(name)
                    and not (cfg.tie_word_embeddings and name == "lm_head.weight"))
    if unused:
        shown = ", ".join(map(repr, unused[:4])) + (f" and {len(unused) - 4} more" if len(unused) > 4 else "")
        raise ValueError(f"{where}: the weights hold {shown}, which {cfg.architecture} as "
                         f"configured does not use; refused rather than run without "
                         f"{'it' if len(unused) == 1 else 'them'}")


def file_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """expected_shapes as a file holds them: Phi-3's q/k/v and gate/up fused."""
    shapes = expected_shapes(cfg)
    if not cfg.fused_projections:
        return shapes
    for layer in range(cfg.num_hidden_layers):
        p = f"model.layers.{layer}."
        for part in "qkv":
            del shapes[p + f"self_attn.{part}_proj.weight"]
        del shapes[p + "mlp.gate_proj.weight"], shapes[p + "mlp.up_proj.weight"]
        shapes[p + "self_attn.qkv_proj.weight"] = (cfg.q_size + 2 * cfg.kv_size, cfg.hidden_size)
        shapes[p + "mlp.gate_up_proj.weight"] = (2 * cfg.intermediate_size, cfg.hidden_size)
    return shapes


def _rows(t, start: int, stop: int):
    """Rows start..stop-1 of an array (a view) or of a PackedWeight."""
    return t[start:stop] if isinstance(t, np.ndarray) else t.take_rows(np.arange(start, stop))


def split_fused(tensors: dict, cfg: ModelConfig) -> dict:
    """Phi-3's fused matrices as the separate ones the forward reads: qkv_proj's rows
    are q, k, v; gate_up_proj's are gate, then up (row slices: no copy)."""
    out = {}
    for name, t in tensors.items():
        if name.endswith("self_attn.qkv_proj.weight"):
            stem = name[:-len("qkv_proj.weight")]
            q, kv = cfg.q_size, cfg.kv_size
            if t.shape[0] != q + 2 * kv:
                raise ValueError(f"tensor {name!r} has {t.shape[0]} rows, expected "
                                 f"{q + 2 * kv} (q, k and v)")
            out.update({stem + "q_proj.weight": _rows(t, 0, q),
                        stem + "k_proj.weight": _rows(t, q, q + kv),
                        stem + "v_proj.weight": _rows(t, q + kv, q + 2 * kv)})
        elif name.endswith("mlp.gate_up_proj.weight"):
            stem, i = name[:-len("gate_up_proj.weight")], cfg.intermediate_size
            if t.shape[0] != 2 * i:
                raise ValueError(f"tensor {name!r} has {t.shape[0]} rows, expected {2 * i} "
                                 f"(gate and up)")
            out.update({stem + "gate_proj.weight": _rows(t, 0, i),
                        stem + "up_proj.weight": _rows(t, i, 2 * i)})
        else:
            out[name] = t
    return out


def check_layer_count(names, cfg: ModelConfig, where: str) -> None:
    """The weights hold exactly layers 0 .. num_hidden_layers - 1; else a ValueError
    naming the missing or extra layers."""
    found = {int(m.group(2)) for m in map(LAYER_NAME.match, names) if m}
    count = cfg.num_hidden_layers  # (a hostile config's 10**9: nothing here grows with it)
    extra = sorted(i for i in found if i >= count)
    if extra:
        problem = f"also hold {_layers(extra)}"
    elif len(found) < count:  # the first and last missing, each a few steps from an end
        first = next(i for i in range(count) if i not in found)
        last = next(i for i in range(count - 1, -1, -1) if i not in found)
        missing = count - len(found)
        problem = f"lack {_layers([first] if missing == 1 else [first, last] if missing == 2 else [first, None, last])}"
    else:
        return
    raise ValueError(f"{where}: config.json says num_hidden_layers={count}, but the weights {problem}")


def _layers(numbers: list) -> str:
    """[n], [a, b], or [first, ..., last] in words."""
    if len(numbers) == 1:
        return f"layer {numbers[0]}"
    return f"layers {numbers[0]}-{numbers[-1]}" if len(numbers) > 2 else f"layers {numbers[0]}, {numbers[1]}"


def check_weights(weights: dict[str, np.ndarray], cfg: ModelConfig, where: str) -> None:
    """Raise ValueError naming a wrong layer count, or the first missing or misshapen tensor."""
    check_layer_count(weights, cfg, where)
    for name, shape in expected_shapes(cfg).items():
        if name not in weights:
            raise ValueError(f"{where}: tensor {name!r} is missing")
        if tuple(weights[name].shape) != shape:
            raise ValueError(f"{where}: tensor {name!r} has shape {list(weights[name].shape)}, "
                             f"expected {list(shape)}")


def load_weights(model_dir: str | os.PathLike, cfg: ModelConfig) -> dict[str, np.ndarray]:
    """Weights of a HF model folder, checked against `cfg`: float32, except F16
    matrices, which stay float16 (safetensors_io.py says why).

    With tied embeddings, `lm_head.weight` is the embedding matrix itself (no copy).
    """
    tensors = read_model_tensors(model_dir)
    if cfg.embedding_only:  # a base model's tensors lack the "model." of a causal model's
        tensors = {name if name.startswith("model.") else "model." + name: t
                   for name, t in tensors.items()}
    if cfg.fused_projections:
        try:
            tensors = split_fused(tensors, cfg)
        except ValueError as e:
            raise ValueError(f"{os.fspath(model_dir)}: {e}") from None
    check_weights(tensors, cfg, os.fspath(model_dir))
    check_consumed(tensors, cfg, os.fspath(model_dir))
    weights = {name: tensors[name] for name in expected_shapes(cfg)}
    if cfg.tie_word_embeddings:
        weights["lm_head.weight"] = weights["model.embed_tokens.weight"]
    return weights


def quantize_matrices(weights: dict, ggml_type: int) -> dict:
    """The weights with every float matrix quantized (EngineConfig.quantization); a
    matrix whose rows do not split into the type's blocks, the norms and anything
    already packed stay as they are. Takes the dict over (convert_matrices)."""
    def quantized(w):
        if isinstance(w, np.ndarray) and w.ndim == 2 and PackedWeight.can_pack(ggml_type, w.shape[1]):
            return PackedWeight.quantize(w, ggml_type)
        return None
    return convert_matrices(weights, quantized)
