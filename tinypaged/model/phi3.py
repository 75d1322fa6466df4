"""Phi-3: Llama with q, k and v in one matrix (qkv_proj: rows q, then k, then v) and
gate and up in one (gate_up_proj: gate rows, then up rows), split when loaded
(weights.py); a sliding window over every layer where the config sets one. Its
long-context RoPE (longrope) is refused by name (rope.py)."""
from .family import Family, window


def read(get, layers: int) -> dict:
    return {"fused_projections": True, "sliding_window": window(get)}


PHI3 = Family("Phi3ForCausalLM", frozenset({"sliding_window", "original_max_position_embeddings"}),
              read)
