"""Phi-3: Llama with q, k and v in one matrix (qkv_proj: rows q, then k, then v) and
gate and up in one (gate_up_proj: gate rows, then up rows), split when loaded
(weights.py); a sliding window over every layer where the config sets one. Its
long-context RoPE (longrope) is refused by name (rope.py)."""
from .family import Family, window
from .gguf_names import GGUFArchitecture


def read(get, layers: int) -> dict:
    return {"fused_projections": True, "sliding_window": window(get)}


def gguf_config(gguf, arch: str, config: dict) -> dict:
    window = gguf.get(f"{arch}.attention.sliding_window")
    return {} if window is None else {"sliding_window": gguf.integer(f"{arch}.attention.sliding_window")}


PHI3 = Family("Phi3ForCausalLM", frozenset({"sliding_window", "original_max_position_embeddings"}),
              read,
              # q, k, v in one matrix, gate and up in ffn_up (split at load, weights.py)
              gguf=GGUFArchitecture("phi3", False, {"attn_qkv.weight": "self_attn.qkv_proj.weight",
                                                   "ffn_up.weight": "mlp.gate_up_proj.weight"},
                                    frozenset({"attention.sliding_window"}), gguf_config))
