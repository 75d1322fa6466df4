"""The paged forward: one straight-line pass over a flat batch of tokens.

Each layer is its family's (family.layer, built from layer.py's pieces); here is
what makes it paged: attention reads and writes the KV pool through the block
tables. A RoPE per layer (none: SmolLM3; local and global: Gemma 3), sliding
windows, GeGLU and the softcaps come from ModelConfig.

The batch mixes prefill chunks and decode tokens of many sequences; where each
token's K/V go and what it attends to comes from AttentionMetadata. `ops` is a
backend module (kernels/cpu, kernels/reference, ...), all with the same op names.
"""
from __future__ import annotations

import numpy as np

from ..batch.attention_metadata import AttentionMetadata
from ..kernels.kv_q8 import KV_INT8, row_width
from .config import ModelConfig
from .layer import LayerPieces, final_norm, qk_norms
from .lora_adapter import SHARED_INPUTS
from .kv_groups import KVGroups
from .rope_tables import RopeTables

QKV, O_PROJ, GATE_UP, DOWN_PROJ = SHARED_INPUTS  # (the module names of each LoRA call)


class PagedKVCache:
    """The KV pool: K and V of shape (layers_per_group, num_blocks, block_size, n_kv, D),
    allocated once by the backend (host or device memory, in the backend's layout), in
    float32, float16 (half the bytes a token; values rounded to float16 when written,
    widened to float32 when attention reads them) or int8 (kernels/kv_q8.py's rows: a
    scale per 32 values). Layer l keeps its K/V in k[slot_of[l]], in the blocks of its
    KV group's table (kv_groups.py); with one group, slot l."""

    def __init__(self, cfg: ModelConfig, num_blocks: int, block_size: int, ops,
                 dtype: str = "float32"):
        shape = (KVGroups.of(cfg).layers_per_group, num_blocks, block_size,
                 cfg.num_key_value_heads, cfg.head_dim)
        self.dtype = np.dtype(dtype)
        self.k, self.v = ops.allocate_kv(shape, self.dtype)
        self.nbytes = num_blocks * self.bytes_per_block(cfg, block_size, dtype)

    @staticmethod
    def bytes_per_block(cfg: ModelConfig, block_size: int, dtype: str = "float32") -> int:
        dtype = np.dtype(dtype)
        row = row_width(cfg.head_dim) if dtype == KV_INT8 else cfg.head_dim * dtype.itemsize
        return 2 * KVGroups.of(cfg).layers_per_group * cfg.num_key_value_heads * row * block_size


class PagedModel:
    """A decoder-only model on a backend (`ops`), run over the paged KV pool."""

    def __init__(self, cfg: ModelConfig, weights: dict[str, np.ndarray], ops,
                 max_positions: int | None = None, prepared: bool = False):
        """weights: taken over; a backend may empty the dict as it converts it, so that
        each original can be freed as soon as its converted form exists.
        max_positions: positions the RoPE tables cover (the engine's max_model_len;
        None: the model's max_position_embeddings). prepared: the weights are the
        backend's form already (ops.load_prepared_weights)."""
        self.cfg, self.ops = cfg, ops
        self.w = weights if prepared else ops.prepare_weights(weights)
        self.rope = RopeTables(cfg, ops, max_positions or cfg.max_position_embeddings)
        self.kv_groups = KVGroups.of(cfg)

    def forward(self, token_ids: np.ndarray, meta: AttentionMetadata,
                kv: PagedKVCache) -> np.ndarray:
        """token_ids (T,) -> logits (S, vocab) of each sequence's last token in the batch
        (a host array; everything else stays where the backend keeps it)."""
        token_ids, meta = self.ops.prepare_inputs(token_ids, meta)
        return self.ops.to_host(self.forward_on_device(token_ids, meta, kv))

    def forward_on_device(self, token_ids, meta, kv: PagedKVCache, lora=None, pooled_rows=None):
        """The forward on inputs the backend already holds (prepare_inputs' results, or
        a static decode step's fixed buffers): logits (R, vocab) where the backend keeps
        them. Every shape comes from the inputs' shapes, never their values.
        lora: a LoRABatch (lora_slots.py) whose rows' adapters add to the products.
        pooled_rows: (head rows, pooled rows), index arrays into those R rows: then
        (logits of the head rows, None when there are none; the pooled rows' final
        norm states), and no head for the pooled rows (embeddings in the batch)."""
        with self.ops.step_workspace():  # (one step's scope: cpu/out_arrays.py)
            return self._forward(token_ids, meta, kv, lora, pooled_rows)

    def _forward(self, token_ids, meta, kv: PagedKVCache, lora=None, pooled_rows=None):
        cfg, w, ops = self.cfg, self.w, self.ops
        x = ops.embedding(token_ids, w["model.embed_tokens.weight"])  # (T, H)
        if cfg.embedding_scale != 1.0:
            x = ops.scale(x, cfg.embedding_scale)
        residual = None
        self.rope.cover(meta.positions)  # (a host backend's tables grow to the step's positions)
        metas = [meta.for_group(g) for g in range(self.kv_groups.num_groups)]

        def attention(layer: int, h, qk_norm):  # with its KV group's tables and slots
            return self._attention(layer, h, qk_norm, metas[self.kv_groups.group_of[layer]], kv, lora)

        def mlp(prefix: str, h, activation: str):
            return self._mlp(prefix, h, activation, lora)
        for layer in range(cfg.num_hidden_layers):
            pieces = LayerPieces(ops, cfg, w, layer, attention, mlp)
            x, residual = cfg.family.layer(pieces, x, residual)

        rows = meta.logits_indices  # (S,): only these tokens need logits
        h = final_norm(ops, cfg, w, ops.gather_rows(x, rows),
                       None if residual is None else ops.gather_rows(residual, rows))
        if pooled_rows is not None:
            head_rows, pooled = pooled_rows
            if not len(head_rows):
                return None, ops.gather_rows(h, pooled)
            return self.head(ops.gather_rows(h, head_rows)), ops.gather_rows(h, pooled)
        return self.head(h)

    def head(self, h):
        """h (R, H): rows of the final norm's states -> their logits (R, vocab)."""
        logits = self.ops.linear(h, self.w["lm_head.weight"])
        cap = self.cfg.final_softcap
        return logits if cap is None else self.ops.softcap(logits, cap)

    def _attention(self, layer: int, h, qk_norm: str | None, meta, kv: PagedKVCache, lora=None):
        """h (T, H) -> o_proj(attention) (T, H); writes the layer's K/V to the pool."""
        cfg, w, ops = self.cfg, self.w, self.ops
        n_tokens = len(h)
        n_heads, n_kv, head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        a = f"model.layers.{layer}.self_attn."
        biases = [w[a + f"{n}_proj.bias"] for n in "qkv"] if cfg.attention_bias else [None] * 3
        q, k, v = ops.qkv_proj(h, w[a + "q_proj.weight"], w[a + "k_proj.weight"], w[a + "v_proj.weight"], *biases,
                               ahead=lora and lora.ahead(layer, QKV))  # (T, n_heads * D), (T, n_kv * D) x 2
        if lora is not None:
            lora.add(h, layer, QKV, (q, k, v))  # (in place)
        q, k = qk_norms(ops, cfg, w, a, qk_norm, q, k)
        cos, sin = self.rope.of_layer[layer]
        slot = self.kv_groups.slot_of[layer]
        q = ops.rope_write_kv(q.reshape(n_tokens, n_heads, head_dim),
                              k.reshape(n_tokens, n_kv, head_dim),
                              v.reshape(n_tokens, n_kv, head_dim), meta.positions,
                              cos, sin, kv.k[slot], kv.v[slot], meta.slot_mapping)
        attn = ops.paged_attention(q, kv.k[slot], kv.v[slot], meta, cfg.window(layer),
                                   cfg.attention_scale, cfg.attn_softcap)  # (T, n_heads, D)
        attn = attn.reshape(n_tokens, n_heads * head_dim)
        out = ops.linear(attn, w[a + "o_proj.weight"], w[a + "o_proj.bias"] if cfg.o_proj_bias else None,
                         ahead=lora and lora.ahead(layer, O_PROJ))
        if lora is not None:
            lora.add(attn, layer, O_PROJ, (out,))
        return out

    def _mlp(self, p: str, h, activation: str, lora=None):
        """h (T, H) -> down(act(gate(h)) * up(h)) (T, H); act SiLU or GELU (tanh)."""
        w, ops = self.w, self.ops
        gate, up = w[p + "mlp.gate_proj.weight"], w[p + "mlp.up_proj.weight"]
        layer = int(p.split(".")[2])
        if lora is not None and (lora.adapts(layer, "gate_proj") or lora.adapts(layer, "up_proj")):
            # the adapters' terms go in before the activation
            mul = ops.gelu_tanh_mul if activation == "gelu_tanh" else ops.silu_mul
            g, u = ops.gate_up(h, gate, up, ahead=lora.ahead(layer, GATE_UP))  # (T, I) x 2
            lora.add(h, layer, GATE_UP, (g, u))
            act = mul(g, u)
        else:
            gate_up = ops.gate_up_gelu if activation == "gelu_tanh" else ops.gate_up_silu
            act = gate_up(h, gate, up)
        out = ops.linear(act, w[p + "mlp.down_proj.weight"], ahead=lora and lora.ahead(layer, DOWN_PROJ))
        if lora is not None:
            lora.add(act, layer, DOWN_PROJ, (out,))
        return out
