"""Dense NumPy Llama forward with a contiguous KV cache: the model-level oracle.

Clarity beats speed here: one straight-line pass per layer using the ops of
`kernels/reference.py`. Covers Llama (biases on q/k/v/o with attention_bias),
Mistral and Qwen2 (q/k/v bias), with sliding windows. float32 by default; float64 for checking other code against.
"""
from __future__ import annotations

import numpy as np

from ..kernels import reference as ops
from .config import ModelConfig


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
        self.w = {name: np.asarray(t.dequantize() if hasattr(t, "dequantize") else t)
                  .astype(self.dtype, copy=False) for name, t in weights.items()}  # packed: widened
        # products with a packed matrix take x rounded to int8 blocks, as every backend does
        self.rounds_x = {name for name, t in weights.items() if hasattr(t, "ggml_type")}

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
        cos, sin = ops.rope_cos_sin(positions, head_dim, cfg.rope, self.dtype)  # (T, D)

        x = w["model.embed_tokens.weight"][ids]  # (T, H)
        for layer in range(cfg.num_hidden_layers):
            p = f"model.layers.{layer}."
            h = ops.rms_norm(x, w[p + "input_layernorm.weight"], cfg.rms_norm_eps)
            q = self._product(h, p + "self_attn.q_proj.weight")  # (T, n_heads * D)
            k = self._product(h, p + "self_attn.k_proj.weight")  # (T, n_kv * D)
            v = self._product(h, p + "self_attn.v_proj.weight")
            if cfg.attention_bias:
                q = q + w[p + "self_attn.q_proj.bias"]
                k = k + w[p + "self_attn.k_proj.bias"]
                v = v + w[p + "self_attn.v_proj.bias"]
            q = ops.apply_rope(q.reshape(n_tokens, n_heads, head_dim), cos, sin)
            k = ops.apply_rope(k.reshape(n_tokens, n_kv, head_dim), cos, sin)
            cache.k[layer, start:end] = k
            cache.v[layer, start:end] = v.reshape(n_tokens, n_kv, head_dim)
            attn = ops.causal_attention(q, cache.k[layer, :end], cache.v[layer, :end], positions,
                                        cfg.window(layer))
            out = self._product(attn.reshape(n_tokens, n_heads * head_dim),
                                p + "self_attn.o_proj.weight")
            x = x + (out + w[p + "self_attn.o_proj.bias"] if cfg.o_proj_bias else out)

            h = ops.rms_norm(x, w[p + "post_attention_layernorm.weight"], cfg.rms_norm_eps)
            gate = self._product(h, p + "mlp.gate_proj.weight")  # (T, I)
            up = self._product(h, p + "mlp.up_proj.weight")
            x = x + self._product(ops.silu_mul(gate, up), p + "mlp.down_proj.weight")
        cache.length = end

        if not all_logits:
            x = x[-1:]
        x = ops.rms_norm(x, w["model.norm.weight"], cfg.rms_norm_eps)
        return self._product(x, "lm_head.weight")  # (T or 1, vocab)
