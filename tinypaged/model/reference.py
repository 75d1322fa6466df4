"""The dense forward with a contiguous KV cache: the model-level oracle.

Clarity beats speed here: the layers are their family's (family.layer), as the paged
forward runs them, over the ops of `kernels/reference.py`; attention is plain causal
attention over the cache, and every product is x @ W.T in the model's dtype
(float32 by default; float64 for checking other code against).
"""
from __future__ import annotations

import numpy as np

from ..formats.weight import is_packed
from ..kernels import reference as ops
from .config import ModelConfig
from .layer import LayerPieces, final_norm, qk_norms


class DenseKVCache:
    """Per-layer K and V buffers (n_layers, max_len, n_kv, D); the first `length` slots hold tokens."""

    def __init__(self, cfg: ModelConfig, max_len: int, dtype=np.float32):
        shape = (cfg.num_hidden_layers, max_len, cfg.num_key_value_heads, cfg.head_dim)
        self.k = np.zeros(shape, dtype=dtype)
        self.v = np.zeros(shape, dtype=dtype)
        self.length = 0

    @property
    def capacity(self) -> int:
        return self.k.shape[1]


class ReferenceModel:
    def __init__(self, cfg: ModelConfig, weights: dict[str, np.ndarray], dtype=np.float32):
        self.cfg = cfg
        self.dtype = np.dtype(dtype)
        self.w = {name: np.asarray(t if isinstance(t, np.ndarray) else t.dequantize())
                  .astype(self.dtype, copy=False) for name, t in weights.items()}  # packed: widened
        # products with a packed matrix take x rounded to int8 blocks, as every backend does
        self.rounds_x = {name for name, t in weights.items() if is_packed(t)}

    def _product(self, x: np.ndarray, name: str) -> np.ndarray:
        """x (T, K) @ W.T for the matrix `name` (x rounded first if it was packed)."""
        if name in self.rounds_x:
            x = ops.round_activations(x.astype(np.float32)).astype(self.dtype)
        return x @ self.w[name].T

    def new_cache(self, max_len: int | None = None) -> DenseKVCache:
        return DenseKVCache(self.cfg, max_len or self.cfg.max_position_embeddings, self.dtype)

    def forward(self, token_ids, cache: DenseKVCache, all_logits: bool = True) -> np.ndarray:
        """Run `token_ids` (T,) after the cache's tokens; append their K/V to the cache.

        Returns logits (T, vocab), or (1, vocab) for the last token when all_logits is False.
        """
        cfg, w = self.cfg, self.w
        ids = np.asarray(token_ids, dtype=np.int64)
        n_tokens, start = len(ids), cache.length
        if n_tokens == 0:
            raise ValueError("forward() needs at least one token")
        if start + n_tokens > cache.capacity:
            raise ValueError(f"sequence of {start + n_tokens} tokens exceeds the cache "
                             f"capacity of {cache.capacity}")
        if ids.min() < 0 or ids.max() >= cfg.vocab_size:
            raise ValueError(f"token id out of range [0, {cfg.vocab_size})")
        positions = np.arange(start, start + n_tokens)
        end = start + n_tokens
        n_heads, n_kv, head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim

        def attention(layer: int, h: np.ndarray, qk_norm: str | None) -> np.ndarray:
            p = f"model.layers.{layer}.self_attn."
            q = self._product(h, p + "q_proj.weight")  # (T, n_heads * D)
            k = self._product(h, p + "k_proj.weight")  # (T, n_kv * D)
            v = self._product(h, p + "v_proj.weight")
            if cfg.attention_bias:
                q, k, v = (t + w[p + f"{n}_proj.bias"] for t, n in zip((q, k, v), "qkv"))
            q, k = qk_norms(ops, cfg, w, p, qk_norm, q, k)
            q, k = q.reshape(n_tokens, n_heads, head_dim), k.reshape(n_tokens, n_kv, head_dim)
            cos, sin = ops.rope_cos_sin(positions, head_dim, cfg.rope_of(layer), self.dtype)  # (T, D)
            q, k = ops.apply_rope(q, cos, sin), ops.apply_rope(k, cos, sin)
            cache.k[layer, start:end] = k
            cache.v[layer, start:end] = v.reshape(n_tokens, n_kv, head_dim)
            if cfg.attention_scale is not None:  # causal_attention divides by sqrt(D)
                q = q * np.asarray(cfg.attention_scale * head_dim ** 0.5, dtype=q.dtype)
            attn = ops.causal_attention(q, cache.k[layer, :end], cache.v[layer, :end], positions,
                                        cfg.window(layer), cfg.attn_softcap)
            out = self._product(attn.reshape(n_tokens, n_heads * head_dim), p + "o_proj.weight")
            return out + w[p + "o_proj.bias"] if cfg.o_proj_bias else out

        def mlp(p: str, h: np.ndarray, activation: str) -> np.ndarray:
            gate = self._product(h, p + "mlp.gate_proj.weight")  # (T, I)
            up = self._product(h, p + "mlp.up_proj.weight")
            act = ops.gelu_tanh_mul if activation == "gelu_tanh" else ops.silu_mul
            return self._product(act(gate, up), p + "mlp.down_proj.weight")

        x = w["model.embed_tokens.weight"][ids]  # (T, H)
        if cfg.embedding_scale != 1.0:
            x = ops.scale(x, cfg.embedding_scale)
        residual = None
        for layer in range(cfg.num_hidden_layers):
            x, residual = cfg.family.layer(LayerPieces(ops, cfg, w, layer, attention, mlp), x, residual)
        cache.length = end

        if not all_logits:
            x, residual = x[-1:], None if residual is None else residual[-1:]
        logits = self._product(final_norm(ops, cfg, w, x, residual), "lm_head.weight")  # (T or 1, vocab)
        return logits if cfg.final_softcap is None else ops.softcap(logits, cfg.final_softcap)
