"""A decoder layer as a family builds it, from shared pieces.

Each family's file says how its layer goes, as a function

    layer(p, x, residual) -> (x, residual)

over the pieces below (x: the residual stream, (T, H); residual: the stream's sum,
carried beside x where a norm adds it on the way in (the pre-norm layout), else
None). The paged forward (paged_model.py) and the dense reference (reference.py) run
the same function with pieces of their own (paged or dense attention, products in
their dtype), and weights.expected_shapes runs it with pieces that only note the
tensors they would read: what a layer reads is what its model must hold.

    p.norm(x, name)                RMSNorm by model.layers.N.<name>.weight
    p.input_norm(x, name)          the same, for a block's input: h goes to attention or
                                   mlp only, whose products may fold the norm in
    p.add_norm(x, residual, name)  residual + x, then its norm, for a block's input:
                                   (h, the new residual)
    p.attention(h, qk_norm=None)   q, k, v (with the biases the model has), the q/k
                                   norm ("head": each head alone; "full": all heads
                                   at once), RoPE, attention over the KV cache, o_proj
    p.mlp(h, activation="silu")    down(act(gate(h)) * up(h)); act SiLU or "gelu_tanh"
    p.scale(x, factor), p.add(x, y)

The layouts most families share are here: pre_norm (Llama), post_norm (OLMo 2),
sandwich (Gemma 2 and 3).
"""
from __future__ import annotations


class LayerPieces:
    """The pieces of layer `layer` on a backend's ops. attention(layer, h, qk_norm) and
    mlp(prefix, h, activation) are the forward's own (each maps (T, H) -> (T, H))."""

    def __init__(self, ops, cfg, w: dict, layer: int, attention, mlp):
        self.ops, self.cfg, self.w, self.layer = ops, cfg, w, layer
        self.prefix = f"model.layers.{layer}."
        self._attention, self._mlp = attention, mlp

    def norm(self, x, name: str):
        return self.ops.rms_norm(x, self.w[self.prefix + name + ".weight"], self.cfg.rms_norm_eps)

    def input_norm(self, x, name: str):
        return self.add_norm(x, None, name)[0]

    def add_norm(self, x, residual, name: str):
        return self.ops.norm_for_products(x, residual, self.w[self.prefix + name + ".weight"],
                                          self.cfg.rms_norm_eps)

    def attention(self, h, qk_norm: str | None = None):
        return self._attention(self.layer, h, qk_norm)

    def mlp(self, h, activation: str = "silu"):
        return self._mlp(self.prefix, h, activation)

    def scale(self, x, factor: float):
        return x if factor == 1.0 else self.ops.scale(x, factor)

    def add(self, x, y):
        return self.ops.add(x, y)


def qk_norms(ops, cfg, w: dict, prefix: str, qk_norm: str | None, q, k):
    """q (T, n_heads * D) and k (T, n_kv * D) after a q/k norm: none, over all heads at
    once ("full"), or over each head ("head": rows of D)."""
    eps = cfg.rms_norm_eps
    if qk_norm == "full":
        return (ops.rms_norm(q, w[prefix + "q_norm.weight"], eps),
                ops.rms_norm(k, w[prefix + "k_norm.weight"], eps))
    if qk_norm == "head":
        d = cfg.head_dim
        return (ops.rms_norm(q.reshape(-1, d), w[prefix + "q_norm.weight"], eps).reshape(q.shape),
                ops.rms_norm(k.reshape(-1, d), w[prefix + "k_norm.weight"], eps).reshape(k.shape))
    assert qk_norm is None, qk_norm
    return q, k


def final_norm(ops, cfg, w: dict, x, residual):
    """The last norm over the stream: x, plus residual where it is carried beside it."""
    if residual is None:
        return ops.rms_norm(x, w["model.norm.weight"], cfg.rms_norm_eps)
    return ops.add_rms_norm(x, residual, w["model.norm.weight"], cfg.rms_norm_eps)[0]


def pre_norm(p, x, residual, qk_norm=None, activation="silu"):
    """Llama's: x + block(norm(x)) for attention, then the MLP; each norm's add fused
    (the stream's sum carried beside x)."""
    h, residual = p.add_norm(x, residual, "input_layernorm")
    x = p.attention(h, qk_norm)
    h, residual = p.add_norm(x, residual, "post_attention_layernorm")  # (the MLP's pre-norm)
    return p.mlp(h, activation), residual


def post_norm(p, x, residual, qk_norm=None, activation="silu"):
    """OLMo 2's: x + norm(block(x)); the stream goes into each block un-normed."""
    x = p.add(x, p.norm(p.attention(x, qk_norm), "post_attention_layernorm"))
    return p.add(x, p.norm(p.mlp(x, activation), "post_feedforward_layernorm")), None


def sandwich(p, x, residual, qk_norm=None, activation="silu"):
    """Gemma 2's and 3's: x + norm(block(norm(x)))."""
    a = p.attention(p.input_norm(x, "input_layernorm"), qk_norm)
    x = p.add(x, p.norm(a, "post_attention_layernorm"))
    m = p.mlp(p.input_norm(x, "pre_feedforward_layernorm"), activation)
    return p.add(x, p.norm(m, "post_feedforward_layernorm")), None


class TensorList:
    """Pieces that run nothing and note the tensors of layer `layer` that the real
    ones would read, name -> shape (weights.expected_shapes)."""

    def __init__(self, cfg, layer: int):
        self.cfg, self.layer, self.prefix = cfg, layer, f"model.layers.{layer}."
        self.shapes: dict[str, tuple[int, ...]] = {}

    def _note(self, name: str, shape: tuple[int, ...]) -> None:
        self.shapes[self.prefix + name] = shape

    def norm(self, x, name: str):
        self._note(name + ".weight", (self.cfg.hidden_size,))
        return x

    def input_norm(self, x, name: str):
        return self.norm(x, name)

    def add_norm(self, x, residual, name: str):
        return self.norm(x, name), residual

    def attention(self, h, qk_norm: str | None = None):
        cfg, a = self.cfg, "self_attn."
        h_size, q, kv = cfg.hidden_size, cfg.q_size, cfg.kv_size
        for name, rows in (("q", q), ("k", kv), ("v", kv)):
            self._note(a + f"{name}_proj.weight", (rows, h_size))
            if cfg.attention_bias:
                self._note(a + f"{name}_proj.bias", (rows,))
        self._note(a + "o_proj.weight", (h_size, q))
        if cfg.o_proj_bias:
            self._note(a + "o_proj.bias", (h_size,))
        if qk_norm is not None:
            head = qk_norm == "head"
            self._note(a + "q_norm.weight", (cfg.head_dim if head else q,))
            self._note(a + "k_norm.weight", (cfg.head_dim if head else kv,))
        return h

    def mlp(self, h, activation: str = "silu"):
        h_size, i = self.cfg.hidden_size, self.cfg.intermediate_size
        self._note("mlp.gate_proj.weight", (i, h_size))
        self._note("mlp.up_proj.weight", (i, h_size))
        self._note("mlp.down_proj.weight", (h_size, i))
        return h

    def scale(self, x, factor: float):
        return x

    def add(self, x, y):
        return x
