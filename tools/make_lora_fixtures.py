"""Make the LoRA fixtures: PEFT adapters over two of the HF fixtures' tiny models
(tests/fixtures/hf/{llama,qwen3}) and the logits of PEFT's merged model at every
position: the independent oracle the engine's adapters are held against
(tests/test_lora.py).

Needs torch, transformers and peft (not test dependencies: the fixtures are
committed). Made with torch 2.13.0 (CPU), transformers 5.25.0 and peft 0.21.2:

    /tmp/hf/bin/pip install torch==2.13.0 transformers peft
    /tmp/hf/bin/python tools/make_lora_fixtures.py

Each case is a folder under tests/fixtures/lora/<case>/: the adapter as PEFT's
save_pretrained writes it (adapter_config.json, adapter_model.safetensors; float32),
less its model card, and logits.npz: prompt_<i> (T,) int64 ids (the base fixture's
prompts), logits_<i> (T, vocab) float32 of the merged model (merge_and_unload) and
base_<i> those of the base alone (a test shows that the adapter changes them).
The base model is the fixture the case's name starts with. Adapter weights are drawn
so that the low-rank term moves the logits as much as a layer's own weights do
(PEFT's init would leave lora_B zero: a no-op adapter).
"""
from __future__ import annotations

import json
import os
import shutil

import numpy as np
import torch
import transformers
from peft import LoraConfig, get_peft_model

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
BASES = os.path.join(ROOT, "tests", "fixtures", "hf")
OUT = os.path.join(ROOT, "tests", "fixtures", "lora")
ALL = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]

# case -> LoraConfig's arguments (the base model: the name's first part)
CASES = {
    "llama-r4": dict(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]),
    "llama-r16-rslora": dict(r=16, lora_alpha=32, target_modules=ALL, use_rslora=True),
    "qwen3-r16": dict(r=16, lora_alpha=16, target_modules=ALL),
    "qwen3-r4-rslora": dict(r=4, lora_alpha=16, target_modules=ALL, use_rslora=True,
                            rank_pattern={"o_proj": 2}, alpha_pattern={"down_proj": 4}),
}


def logits(model, ids: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return model(torch.tensor(ids)[None]).logits[0].float().numpy()


def make(case: str, options: dict) -> None:
    base_folder = os.path.join(BASES, case.split("-")[0])
    prompts = np.load(os.path.join(base_folder, "logits.npz"))
    prompts = [prompts[f"prompt_{i}"] for i in range(len(prompts.files) // 2)]
    base = transformers.AutoModelForCausalLM.from_pretrained(base_folder, dtype=torch.float32).eval()
    base_logits = [logits(base, ids) for ids in prompts]
    torch.manual_seed(sum(map(ord, case)))
    model = get_peft_model(base, LoraConfig(init_lora_weights=False, lora_dropout=0.0, **options))
    with torch.no_grad():
        for name, module in model.named_modules():
            if hasattr(module, "lora_A") and "default" in module.lora_A:
                a, b = module.lora_A["default"].weight, module.lora_B["default"].weight
                a.copy_(torch.randn_like(a) / a.shape[1] ** 0.5)
                # s * B @ A of about a base matrix's size (1.5 / sqrt(fan_in) per entry)
                s = module.scaling["default"]
                b.copy_(torch.randn_like(b) * 1.5 / (s * (a.shape[0] * a.shape[1]) ** 0.5))
    folder = os.path.join(OUT, case)
    shutil.rmtree(folder, ignore_errors=True)
    model.save_pretrained(folder)
    os.remove(os.path.join(folder, "README.md"))  # (the model card: boilerplate)
    config_path = os.path.join(folder, "adapter_config.json")
    with open(config_path) as f:
        config = json.load(f)
    config["base_model_name_or_path"] = "tests/fixtures/hf/" + case.split("-")[0]  # (not this machine's path)
    with open(config_path, "w") as f:
        json.dump(config, f, indent=2, sort_keys=True)
    model.eval()
    unmerged = [logits(model, ids) for ids in prompts]
    merged = model.merge_and_unload()
    arrays = {}
    for i, ids in enumerate(prompts):
        arrays[f"prompt_{i}"], arrays[f"logits_{i}"] = ids, logits(merged, ids)
        arrays[f"base_{i}"] = base_logits[i]
        np.testing.assert_allclose(unmerged[i], arrays[f"logits_{i}"], atol=1e-4)  # (merging is exact math)
        assert np.abs(arrays[f"logits_{i}"] - base_logits[i]).max() > 0.5  # (the adapter matters)
    np.savez_compressed(os.path.join(folder, "logits.npz"), **arrays)
    print(case, {k: v.shape for k, v in arrays.items()})


def main() -> None:
    os.makedirs(OUT, exist_ok=True)
    for case, options in CASES.items():
        make(case, options)


if __name__ == "__main__":
    main()
