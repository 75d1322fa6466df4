"""Make the HF-transformers fixtures: tiny random models and their float32 logits,
the independent oracle each architecture is held against (tests/test_hf_parity.py).

Needs torch and transformers (not test dependencies: the fixtures are committed).
Made with torch 2.13.0 (CPU) and transformers 5.24.0:

    python -m venv /tmp/hf && /tmp/hf/bin/pip install torch==2.13.0 transformers
    /tmp/hf/bin/python tools/make_hf_fixtures.py            # all cases
    /tmp/hf/bin/python tools/make_hf_fixtures.py llama3     # one

Each case is a folder under tests/fixtures/hf/<case>/:
  config.json       as transformers >= 5 saves it (rope_parameters, layer_types)
  config.v4.json    the same model in the older layout (rope_theta, rope_scaling,
                    use_sliding_window...), checked here to give transformers the
                    same logits
  model.safetensors float16 weights (drawn in float32, rounded to float16 before the
                    logits are taken, so the file holds exactly the model measured)
  logits.npz        prompt_<i> (T,) int64 token ids, logits_<i> (T, vocab) float32
Weights are drawn so that every part matters: norms around 1 +- 0.3, biases of
+-0.3, projections at 1.5 / sqrt(fan_in); hidden 64, 2 layers, rope_theta 50000,
vocab 128; prompts of 6 and 40 tokens (longer than every sliding window here).
"""
from __future__ import annotations

import copy
import json
import os
import shutil
import sys
import zlib

import numpy as np
import torch
import transformers

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
OUT = os.path.join(ROOT, "tests", "fixtures", "hf")
SHAPE = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
             rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=2, pad_token_id=None,
             tie_word_embeddings=False)
THETA = 50000.0
PROMPT_LENGTHS = (6, 40)

# case -> (config class name, extra config keys in the new layout)
CASES = {
    "llama": ("LlamaConfig", {}),
    "llama-tied": ("LlamaConfig", {"tie_word_embeddings": True}),
    "llama-bias": ("LlamaConfig", {"attention_bias": True}),
    "llama-linear": ("LlamaConfig", {"rope_parameters": {"rope_type": "linear", "factor": 4.0}}),
    "llama3": ("LlamaConfig", {"rope_parameters": {
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 16}}),
    "llama-yarn": ("LlamaConfig", {"rope_parameters": {
        "rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 32}}),
    "mistral-window": ("MistralConfig", {"sliding_window": 8, "head_dim": 16}),
    "qwen2": ("Qwen2Config", {}),
    "qwen2-window": ("Qwen2Config", {"use_sliding_window": True, "sliding_window": 8,
                                     "max_window_layers": 1}),
    "qwen2-yarn": ("Qwen2Config", {"rope_parameters": {
        "rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 32}}),
    "qwen3": ("Qwen3Config", {"head_dim": 16}),
    "qwen3-window": ("Qwen3Config", {"head_dim": 16, "use_sliding_window": True,
                                     "sliding_window": 8, "max_window_layers": 1}),
    "smollm3": ("SmolLM3Config", {"no_rope_layer_interval": 2}),  # layer 1 without RoPE
    # what llama.cpp's smollm3 fixes: every 4th layer without RoPE (no key says so)
    "smollm3-gguf": ("SmolLM3Config", {"num_hidden_layers": 4, "no_rope_layer_interval": 4}),
    "granite": ("GraniteConfig", {"embedding_multiplier": 2.5, "residual_multiplier": 0.4,
                                  "attention_multiplier": 0.11, "logits_scaling": 3.0}),
    "olmo2": ("Olmo2Config", {}),
    "phi3": ("Phi3Config", {}),
    "phi3-window": ("Phi3Config", {"sliding_window": 8}),
    "gemma": ("GemmaConfig", {"head_dim": 16, "tie_word_embeddings": True}),
    # (query_pre_attn_scalar = head_dim, as llama.cpp assumes for all but the 27B models)
    "gemma2": ("Gemma2Config", {"head_dim": 16, "sliding_window": 8, "query_pre_attn_scalar": 16,
                                "attn_logit_softcapping": 3.0, "final_logit_softcapping": 5.0}),
    "gemma3": ("Gemma3TextConfig", {"head_dim": 16, "sliding_window": 8, "query_pre_attn_scalar": 24,
                                    "num_hidden_layers": 3, "sliding_window_pattern": 3,
                                    "rope_parameters": {
                                        "full_attention": {"rope_type": "linear", "factor": 4.0,
                                                           "rope_theta": 80000.0},
                                        "sliding_attention": {"rope_type": "default",
                                                              "rope_theta": 1000.0}}}),
    # what llama.cpp's gemma3 fixes: six layers a period, local base 10,000, scalar = head_dim
    "gemma3-gguf": ("Gemma3TextConfig", {"head_dim": 16, "sliding_window": 8,
                                         "query_pre_attn_scalar": 16, "num_hidden_layers": 6,
                                         "rope_parameters": {
                                             "full_attention": {"rope_type": "default",
                                                                "rope_theta": 1000000.0},
                                             "sliding_attention": {"rope_type": "default",
                                                                   "rope_theta": 10000.0}}}),
}
MODELS = {"LlamaConfig": "LlamaForCausalLM", "MistralConfig": "MistralForCausalLM",
          "Qwen2Config": "Qwen2ForCausalLM", "Qwen3Config": "Qwen3ForCausalLM",
          "SmolLM3Config": "SmolLM3ForCausalLM", "GraniteConfig": "GraniteForCausalLM",
          "Olmo2Config": "Olmo2ForCausalLM", "Phi3Config": "Phi3ForCausalLM",
          "GemmaConfig": "GemmaForCausalLM", "Gemma2Config": "Gemma2ForCausalLM",
          "Gemma3TextConfig": "Gemma3ForCausalLM"}


def build(config_class: str, extra: dict, seed: int):
    extra = dict(extra)
    rope = dict(extra.pop("rope_parameters", {"rope_type": "default"}))
    if "full_attention" not in rope:  # (Gemma 3's are nested by layer type, thetas given)
        rope["rope_theta"] = THETA
    config = getattr(transformers, config_class)(**{**SHAPE, **extra}, rope_parameters=rope)
    torch.manual_seed(seed)
    model = getattr(transformers, MODELS[config_class])(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.3 * torch.randn_like(p))
            elif name.endswith(".bias"):
                p.copy_(0.3 * torch.randn_like(p))
            else:
                p.copy_(torch.randn_like(p) * 1.5 / p.shape[-1] ** 0.5)
            p.copy_(p.half().float())  # the model measured is the one saved in float16
    return model


def old_layout(config: dict) -> dict:
    """config.json as transformers < 5 wrote it."""
    old = {k: v for k, v in config.items() if k not in ("rope_parameters", "layer_types", "dtype")}
    if "full_attention" in config["rope_parameters"]:  # Gemma 3: one RoPE per layer type
        full = dict(config["rope_parameters"]["full_attention"])
        old["rope_theta"] = full.pop("rope_theta")
        old["rope_local_base_freq"] = config["rope_parameters"]["sliding_attention"]["rope_theta"]
        if full.pop("rope_type") != "default":
            old["rope_scaling"] = {"rope_type": config["rope_parameters"]["full_attention"]["rope_type"],
                                   **full}
        kinds = config["layer_types"]
        old["sliding_window_pattern"] = kinds.index("full_attention") + 1
        old["torch_dtype"] = "float16"
        return old
    rope = dict(config["rope_parameters"])
    old["rope_theta"] = rope.pop("rope_theta")
    if rope.pop("rope_type") != "default":
        old["rope_scaling"] = {"type" if config["model_type"] == "qwen2" else "rope_type":
                               config["rope_parameters"]["rope_type"], **rope}
    old["torch_dtype"] = "float16"
    return old


def logits(model, ids: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return model(torch.from_numpy(ids)[None]).logits[0].float().numpy()


def make(case: str) -> None:
    config_class, extra = CASES[case]
    seed = zlib.crc32(case.encode())  # stable as cases are added
    model = build(config_class, extra, seed)
    folder = os.path.join(OUT, case)
    shutil.rmtree(folder, ignore_errors=True)
    copy.deepcopy(model).half().save_pretrained(folder)  # (half() would round RoPE's buffers too)
    with open(os.path.join(folder, "config.json")) as f:
        config = json.load(f)
    with open(os.path.join(folder, "config.v4.json"), "w") as f:
        json.dump(old_layout(config), f, indent=2)
    rng = np.random.default_rng(seed)
    arrays = {}
    for i, n in enumerate(PROMPT_LENGTHS):
        ids = rng.integers(3, SHAPE["vocab_size"], n).astype(np.int64)
        arrays[f"prompt_{i}"], arrays[f"logits_{i}"] = ids, logits(model, ids)
    # the older layout must mean the same model to transformers itself
    old = getattr(transformers, config_class).from_dict(old_layout(config))
    again = getattr(transformers, MODELS[config_class])(old).eval()
    again.load_state_dict(model.state_dict())
    for i in range(len(PROMPT_LENGTHS)):
        np.testing.assert_array_equal(logits(again, arrays[f"prompt_{i}"]), arrays[f"logits_{i}"])
    np.savez_compressed(os.path.join(folder, "logits.npz"), **arrays)
    for extra_file in ("generation_config.json",):
        path = os.path.join(folder, extra_file)
        if os.path.exists(path):
            os.remove(path)
    print(f"{case}: {sum(os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder))} bytes")


def main() -> None:
    for case in sys.argv[1:] or CASES:
        make(case)


if __name__ == "__main__":
    main()
