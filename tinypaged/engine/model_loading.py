"""A model's weights in the backend's form, as a PagedModel: the target's and a draft
model's alike, loaded on a thread of its own (load_thread.py says why: a parallel
kernel run in the caller's thread leaves a second OpenMP team, and every later step
of the engine loop runs slower beside it); and, on the CUDA backend, its recorded
decode steps (decode_graphs).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable

from ..config import EngineConfig
from ..formats.quant_kind import KINDS, QUANTIZE_TARGETS
from ..model.config import ModelConfig
from ..model.loading import load_model, requantized
from ..model.paged_model import PagedKVCache, PagedModel
from ..model.weights import quantize_matrices
from .block_manager import blocks_for
from .kv_pool import check_rope_fits
from .load_thread import started_on_own_thread

QUANTIZATION_TYPES = {KINDS[code].name.lower(): code for code in QUANTIZE_TARGETS}  # "q8_0", "q4_0", "q4_1"


@dataclass(slots=True)
class LoadedModel:
    model: PagedModel
    config: ModelConfig
    requantized: dict  # tensor name -> "Q5_0 -> Q8_0" (the file's kinds the backend widened)
    max_model_len: int


def load_paged_model(model_dir: str | os.PathLike, ops, max_model_len: int | None,
                     layout_cache: bool = True, quantization: str | None = None) -> LoadedModel:
    """The model at model_dir with its weights in the backend's form: mapped from the
    form kept beside a GGUF by an earlier load (layout_cache), else read, prepared, and
    kept; quantized to `quantization` ("q8_0", ...) where given. max_model_len: the
    context asked for (None: the model's own), capped at the model's."""
    return start_loading(model_dir, ops, max_model_len, layout_cache, quantization)()


def start_loading(model_dir: str | os.PathLike, ops, max_model_len: int | None,
                  layout_cache: bool = True, quantization: str | None = None) -> Callable[[], LoadedModel]:
    """load_paged_model started; returns the wait for its LoadedModel (the caller must
    wait, whatever happens to it meanwhile)."""
    return started_on_own_thread(lambda: _load(model_dir, ops, max_model_len, layout_cache,
                                               quantization))


def _load(model_dir, ops, max_model_len, layout_cache, quantization) -> LoadedModel:
    ops.use_in_this_thread()
    kept = layout_cache and not quantization
    prepared = ops.load_prepared_weights(model_dir) if kept else None
    cfg, weights = load_model(model_dir, prepared)
    if quantization:
        weights = quantize_matrices(weights, QUANTIZATION_TYPES[quantization])
    context = min(max_model_len or cfg.max_position_embeddings, cfg.max_position_embeddings)
    check_rope_fits(context, cfg.head_dim, ops.memory_available())
    model = PagedModel(cfg, weights, ops, context,  # weights go to the backend
                       prepared=prepared is not None)
    del weights  # (the backend's form replaces them)
    if kept and prepared is None:
        ops.save_prepared_weights(model_dir, model.w)
    return LoadedModel(model, cfg, requantized(model_dir), context)


def decode_graphs(config: EngineConfig, model: PagedModel, kv: PagedKVCache,
                  max_model_len: int):
    """The CUDA backend's recorded decode steps (kernels/cuda/decode_graphs.py) when
    config.cuda_graphs asks for them; None (every step eager) otherwise. cuda_graphs
    None means on with a real GPU; on the simulator True replays launch by launch.
    Verification steps are recorded too: their rows are decode rows."""
    if model.ops.name != "cuda":
        return None
    from ..kernels.cuda import cuda_usable
    from ..kernels.cuda.decode_graphs import DecodeGraphs

    gpu = cuda_usable()
    if not (gpu if config.cuda_graphs is None else config.cuda_graphs):
        return None
    rows = config.max_num_seqs
    if config.speculative_config is not None:  # (a verification's rows: speculation.py)
        rows = max(rows, min(rows * (1 + config.speculative_config.num_speculative_tokens),
                             config.max_num_batched_tokens))
    return DecodeGraphs(model, kv, rows, blocks_for(max_model_len, config.block_size), capture=gpu)
