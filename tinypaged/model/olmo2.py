"""OLMo 2: the norms come after the blocks, not before them. Each layer adds
post_attention_layernorm(attention(x)) and then post_feedforward_layernorm(mlp(x))
to the residual stream x, whose sum goes into the next block un-normed; q and k
are each normed over the whole projection (all heads at once), before RoPE."""
from .family import Family, attention_biases
from .gguf_names import QK_NORMS, GGUFArchitecture
from .layer import post_norm


def read(get, layers: int) -> dict:
    return attention_biases(get)


def layer(p, x, residual):
    return post_norm(p, x, residual, qk_norm="full")


OLMO2 = Family("Olmo2ForCausalLM", frozenset({"attention_bias"}), read,
               gguf=GGUFArchitecture("olmo2", False, {
                   **QK_NORMS, "post_attention_norm.weight": "post_attention_layernorm.weight",
                   "post_ffw_norm.weight": "post_feedforward_layernorm.weight"}),
               layer=layer)
