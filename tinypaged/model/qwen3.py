"""Qwen3: Qwen2 with an RMSNorm over each head of q and k (q_norm, k_norm, applied
before RoPE), and biases only where attention_bias says (on q, k, v and o)."""
from .family import Family, QWEN_WINDOW_KEYS, attention_biases, qwen_windows
from .gguf_names import QK_NORMS, GGUFArchitecture
from .layer import pre_norm


def read(get, layers: int) -> dict:
    return {**attention_biases(get), **qwen_windows(get, layers)}


def layer(p, x, residual):
    return pre_norm(p, x, residual, qk_norm="head")


QWEN3 = Family("Qwen3ForCausalLM", QWEN_WINDOW_KEYS | {"attention_bias"}, read,
               gguf=GGUFArchitecture("qwen3", False, QK_NORMS), layer=layer)
