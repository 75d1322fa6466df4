"""The Gemma 3 270M figures tests/test_gemma3.py holds tinypaged to, made by HF
transformers from the same GGUF file (`python cli.py pull gemma-3-270m` first):
  - token ids of mixed text (whitespace runs, tabs, accents, CJK, emoji, code) from
    transformers' own GGUF tokenizer conversion;
  - the perplexity of tests/data/prose.txt under transformers' float32 forward pass
    on the file dequantized (its GGUF loader), on the token ids tinypaged gives.
Written to tests/fixtures/gemma3_270m.json.

Made with torch 2.13.0 (CPU), transformers 5.24.0, gguf and accelerate:
    /tmp/hf/bin/pip install torch==2.13.0 transformers gguf accelerate
    /tmp/hf/bin/python tools/make_gemma3_fixtures.py
(it imports tinypaged from this checkout for the prose's ids: add numba).
"""
from __future__ import annotations

import json
import os
import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)
GGUF = os.path.join(ROOT, "weights", "gemma-3-270m-q4_k_m.gguf")
OUT = os.path.join(ROOT, "tests", "fixtures", "gemma3_270m.json")
TEXTS = [
    "Hello world",
    "  two  spaces,\tthen a tab;\n\nnew paragraphs\n\n\n   and indented",
    "café naïve résumé Ångström — “quotes” … ½",
    "日本語のテキストと中文文本，한국어도",
    "emoji 🤖🚀 and ZWJ 👩‍💻 flags 🇫🇷",
    "def f(x):\n    return x**2  # code\n\tif x != 0: print(f'{x:>8}')",
    "<start_of_turn>user\nHi!<end_of_turn>\n",
    "numbers 3.14159 1,000,000 0x1F and URLs https://example.com/a?b=c",
]


def main() -> None:
    from tinypaged.tokenizer import Tokenizer
    folder, name = os.path.split(GGUF)
    theirs = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    tokens = [{"text": t, "ids": theirs.encode(t, add_special_tokens=False)} for t in TEXTS]
    with open(os.path.join(ROOT, "tests", "data", "prose.txt"), encoding="utf-8") as f:
        ids = Tokenizer(GGUF).encode(f.read())
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].double()
    nll = -torch.log_softmax(logits, -1)[torch.arange(len(ids) - 1), torch.tensor(ids[1:])]
    figures = {"tokens": tokens, "prose_ids": ids,
               "prose_perplexity_transformers_float32": float(torch.exp(nll.mean()))}
    with open(OUT, "w", encoding="utf-8") as f:
        json.dump(figures, f, ensure_ascii=False, indent=1)
    print(f"wrote {OUT}: perplexity {figures['prose_perplexity_transformers_float32']:.4f} "
          f"over {len(ids)} tokens")


if __name__ == "__main__":
    main()
