"""What transformers' own GGUF tokenizer conversion makes of byte-level vocabularies
with each pre-tokenizer name tinypaged reads, and of a SentencePiece vocabulary with
and without add_space_prefix (tests/gguf_writer.py writes the same files in the
test): token ids of mixed text, written to tests/fixtures/pre_tokenizers.json for
tests/test_gguf_pre_tokenizers.py.

    /tmp/hf/bin/python tools/make_tokenizer_fixtures.py   (transformers 5.24.0, gguf)
"""
from __future__ import annotations

import json
import os
import sys
import tempfile

from transformers import AutoTokenizer

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, os.path.join(ROOT, "tests"))
from gguf_writer import byte_level_vocab_gguf, sentencepiece_vocab_gguf  # noqa: E402

PRES = ["llama-bpe", "qwen2", "gpt-4o"]
# (no text opens with a space: there transformers' Metaspace leaves out the leading
# "▁" that llama.cpp and SentencePiece's add_dummy_prefix always put; the test checks
# llama.cpp's rule on its own)
SPM_TEXTS = ["hello world", "the hello, in the world.", "hello  world  123", "héllo wörld ✓",
             "hello\nworld\tthe"]
TEXTS = ["12345 and 123 45", "hello world, I'm here: he's HELLO World", "  The\n\n\nworld\t 1",
         "café 日本 🤖 don'T", "x=12;y = 4545//3"]


def main() -> None:
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for pre in PRES:
            byte_level_vocab_gguf(os.path.join(tmp, f"{pre}.gguf"), pre)
            tok = AutoTokenizer.from_pretrained(tmp, gguf_file=f"{pre}.gguf")
            out[pre] = [{"text": t, "ids": tok.encode(t, add_special_tokens=False)} for t in TEXTS]
        # SentencePiece with the leading space (Llama 2's files). (Without it, as Gemma's
        # files are, transformers' generic converter adds the space anyway, where
        # llama.cpp does not: Gemma 3's own file is the test of that case.)
        for prefix in (True,):
            name = f"spm-prefix-{str(prefix).lower()}"
            sentencepiece_vocab_gguf(os.path.join(tmp, f"{name}.gguf"), prefix)
            tok = AutoTokenizer.from_pretrained(tmp, gguf_file=f"{name}.gguf")
            out[name] = [{"text": t, "ids": tok.encode(t, add_special_tokens=False)}
                         for t in SPM_TEXTS]
    path = os.path.join(ROOT, "tests", "fixtures", "pre_tokenizers.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=1)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
