"""One decoder layer, as every family's differs: where its norms sit, the q/k norm,
the multipliers. The paged forward (paged_model.py) and the dense reference
(reference.py) both run their layers through `decoder_layer`, handing it their own
attention and MLP (paged and dense attention; the reference's products in its dtype).

A family picks a layout by its norm_layout (family files set it):
    pre       Llama and most: x = x + block(norm(x)), the norm's add fused
              (ops.add_rms_norm), the residual stream carried beside x
    post      OLMo 2: x = x + norm(block(x)); the stream goes in un-normed
    sandwich  Gemma 2 and 3: x = x + norm(block(norm(x)))
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class NormLayout:
    name: str
    norms: tuple[str, ...]  # the layer's norm tensors (model.layers.N.<norm>.weight)


LAYOUTS = {layout.name: layout for layout in (
    # (Llama's post_attention_layernorm is the MLP's pre-norm)
    NormLayout("pre", ("input_layernorm", "post_attention_layernorm")),
    NormLayout("post", ("post_attention_layernorm", "post_feedforward_layernorm")),
    NormLayout("sandwich", ("input_layernorm", "post_attention_layernorm",
                            "pre_feedforward_layernorm", "post_feedforward_layernorm")),
)}


def decoder_layer(ops, cfg, w: dict, layer: int, x, residual, attention, mlp):
    """Layer `layer` on x (T, H) -> (x, residual). attention(layer, h) and mlp(prefix, h)
    map (T, H) -> (T, H). residual: the stream's sum so far, or None where x is the
    stream (the first layer; every layer of the post and sandwich layouts)."""
    p, eps = f"model.layers.{layer}.", cfg.rms_norm_eps

    def norm(h, name: str):
        return ops.rms_norm(h, w[p + name + ".weight"], eps)

    if cfg.norm_layout == "pre":
        h, residual = ops.add_rms_norm(x, residual, w[p + "input_layernorm.weight"], eps)
        x = scaled(ops, cfg, attention(layer, h))
        h, residual = ops.add_rms_norm(x, residual, w[p + "post_attention_layernorm.weight"], eps)
        return scaled(ops, cfg, mlp(p, h)), residual
    sandwich = cfg.norm_layout == "sandwich"
    a = attention(layer, norm(x, "input_layernorm") if sandwich else x)
    x = ops.add(x, norm(a, "post_attention_layernorm"))
    m = mlp(p, norm(x, "pre_feedforward_layernorm") if sandwich else x)
    return ops.add(x, norm(m, "post_feedforward_layernorm")), None


def final_norm(ops, cfg, w: dict, x, residual):
    """The last norm over the stream: x, plus residual where it is carried beside it."""
    if residual is None:
        return ops.rms_norm(x, w["model.norm.weight"], cfg.rms_norm_eps)
    return ops.add_rms_norm(x, residual, w["model.norm.weight"], cfg.rms_norm_eps)[0]


def scaled(ops, cfg, x):
    """A block's output as it joins the residual stream (Granite's multiplier)."""
    return x if cfg.residual_scale == 1.0 else ops.scale(x, cfg.residual_scale)


def qk_norms(ops, cfg, w: dict, prefix: str, q, k):
    """q (T, n_heads * D) and k (T, n_kv * D) after the family's q/k norm: none, over
    all heads at once ("full", OLMo 2) or over each head ("head", Qwen3, Gemma 3)."""
    eps = cfg.rms_norm_eps
    if cfg.qk_norm == "full":
        return (ops.rms_norm(q, w[prefix + "q_norm.weight"], eps),
                ops.rms_norm(k, w[prefix + "k_norm.weight"], eps))
    if cfg.qk_norm == "head":  # rows of D
        d = cfg.head_dim
        return (ops.rms_norm(q.reshape(-1, d), w[prefix + "q_norm.weight"], eps).reshape(q.shape),
                ops.rms_norm(k.reshape(-1, d), w[prefix + "k_norm.weight"], eps).reshape(k.shape))
    return q, k
