"""Make the embedding fixtures: tiny random decoder models saved as sentence-transformers
folders, one per pooling kind, with the embeddings sentence-transformers computes for a
few texts: the independent oracle LLM.embed is held against (tests/test_embeddings.py).

Needs torch, transformers and sentence-transformers (not test dependencies: the
fixtures are committed). Made with torch 2.13.0 (CPU), transformers 5.25.0 and
sentence-transformers 6.3.0:

    /tmp/hf/bin/pip install torch==2.13.0 transformers sentence-transformers
    /tmp/hf/bin/python tools/make_embedding_fixtures.py

Each case is a folder under tests/fixtures/embeddings/<case>/, as
SentenceTransformer.save writes it, less its model card (modules.json, 1_Pooling/config.json, 2_Normalize/
where normalized; the transformer's config.json and model.safetensors: a bare
Qwen3Model or LlamaModel, its tensors without the "model." prefix and without an
lm_head, as embedding models ship), plus expected.json: the texts and their
embeddings, each text encoded alone (no padding), float32.
The tokenizer is stories260K's (tests/models/stories260K: 512 tokens, BOS added).
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile

import numpy as np
import torch
import transformers
from sentence_transformers import SentenceTransformer, models

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
OUT = os.path.join(ROOT, "tests", "fixtures", "embeddings")
TOKENIZER = os.path.join(ROOT, "tests", "models", "stories260K", "tokenizer.json")
SHAPE = dict(vocab_size=512, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
             rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=2, tie_word_embeddings=True,
             rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
TEXTS = ["Once upon a time there was a little girl.",
         "The cat sat on the mat and looked at the sun.",
         "Tom and Lily went to the park to play with a big red ball, and then they went home.",
         "Hi"]
# case -> (config class, model class, pooling mode, normalize)
CASES = {
    "qwen3-lasttoken": ("Qwen3Config", "Qwen3Model", "lasttoken", True),
    "qwen3-mean": ("Qwen3Config", "Qwen3Model", "mean", True),
    "llama-cls": ("LlamaConfig", "LlamaModel", "cls", False),
}


def make(case: str, config_class: str, model_class: str, mode: str, normalize: bool) -> None:
    extra = {"head_dim": 16} if config_class == "Qwen3Config" else {}
    config = getattr(transformers, config_class)(**SHAPE, **extra)
    torch.manual_seed(sum(map(ord, case)))
    model = getattr(transformers, model_class)(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.3 * torch.randn_like(p))
            else:
                p.copy_(torch.randn_like(p) * 1.5 / p.shape[-1] ** 0.5)
            p.copy_(p.half().float())  # (exact in float16: the file holds the model measured)
    with tempfile.TemporaryDirectory() as base:
        model.save_pretrained(base)
        shutil.copy(TOKENIZER, os.path.join(base, "tokenizer.json"))
        with open(os.path.join(base, "tokenizer_config.json"), "w") as f:
            json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>",
                       "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<unk>",
                       "add_bos_token": True}, f)
        modules = [models.Transformer(base), models.Pooling(SHAPE["hidden_size"], pooling_mode=mode)]
        if normalize:
            modules.append(models.Normalize())
        st = SentenceTransformer(modules=modules, device="cpu")
        folder = os.path.join(OUT, case)
        shutil.rmtree(folder, ignore_errors=True)
        st.save(folder)
        os.remove(os.path.join(folder, "README.md"))  # (the model card: boilerplate)
    st = SentenceTransformer(folder, device="cpu")  # (read back, as a user would)
    vectors = [st.encode([text], convert_to_numpy=True)[0].astype(np.float32).tolist()
               for text in TEXTS]
    with open(os.path.join(folder, "expected.json"), "w") as f:
        json.dump({"texts": TEXTS, "embeddings": vectors, "pooling": mode,
                   "normalize": normalize}, f)
    print(case, [round(float(np.linalg.norm(v)), 3) for v in vectors])


if __name__ == "__main__":
    for name, spec in CASES.items():
        make(name, *spec)
