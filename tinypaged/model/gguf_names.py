"""GGUF's names for a model's tensors, as llama.cpp's converter writes them, and
what a family declares to be read from a GGUF file (GGUFArchitecture; each family
file holds its own)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

# llama.cpp's tensor names in a layer (blk.N.<name>) -> HF's (model.layers.N.<name>)
LAYER_TENSORS = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_output.bias": "self_attn.o_proj.bias",
    "ffn_norm.weight": "post_attention_layernorm.weight",  # Llama's: the MLP's pre-norm
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
GLOBAL_TENSORS = {"token_embd.weight": "model.embed_tokens.weight",
                  "output_norm.weight": "model.norm.weight",
                  "output.weight": "lm_head.weight"}
QK_NORMS = {"attn_q_norm.weight": "self_attn.q_norm.weight",
            "attn_k_norm.weight": "self_attn.k_norm.weight"}
SANDWICH = {"ffn_norm.weight": "pre_feedforward_layernorm.weight",  # (Gemma 2 and 3)
            "post_attention_norm.weight": "post_attention_layernorm.weight",
            "post_ffw_norm.weight": "post_feedforward_layernorm.weight"}


@dataclass(frozen=True)
class GGUFArchitecture:
    name: str  # general.architecture in the file
    permuted: bool  # Q/K rows interleaved by llama.cpp's converter (Llama's RoPE form)
    tensors: dict  # layer tensor names beyond (or replacing) LAYER_TENSORS'
    keys: frozenset = frozenset()  # <arch>.* keys read beyond READ
    config: Callable = lambda gguf, arch, config: {}  # (file, arch, config so far) -> more keys
