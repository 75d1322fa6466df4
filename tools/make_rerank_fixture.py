"""Make the reranking fixture: a tiny random Qwen3ForCausalLM scoring query-document
pairs as Qwen3-Reranker does (the prompt below; the score is softmax over the logits
of "no" and "yes" at its last token, "yes"'s share), with the scores transformers
computes: the independent oracle LLM.score is held against (tests/test_rerank.py).

Needs torch and transformers (not test dependencies: the fixture is committed). Made
with torch 2.13.0 (CPU) and transformers 5.25.0:

    /tmp/hf/bin/python tools/make_rerank_fixture.py

tests/fixtures/rerank/qwen3/: config.json, model.safetensors (float32, values exact in
float16), tokenizer.json (stories260K's, with "yes" and "no" added as tokens of their
own, as a real reranker's vocabulary has them), tokenizer_config.json, expected.json
(query, documents, instruction, the prompts' token ids, scores).
"""
from __future__ import annotations

import json
import os
import shutil

import numpy as np
import torch
import transformers
from tokenizers import Tokenizer

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
OUT = os.path.join(ROOT, "tests", "fixtures", "rerank", "qwen3")
TOKENIZER = os.path.join(ROOT, "tests", "models", "stories260K", "tokenizer.json")
# Qwen3-Reranker's prompt (its model card's), which tinypaged's default rerank template writes
PREFIX = ("<|im_start|>system\nJudge whether the Document meets the requirements based on the "
          "Query and the Instruct provided. Note that the answer can only be \"yes\" or \"no\"."
          "<|im_end|>\n<|im_start|>user\n")
SUFFIX = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
INSTRUCTION = "Given a web search query, retrieve relevant passages that answer the query"
QUERY = "Where did the cat sit?"
DOCUMENTS = ["The cat sat on the mat.", "Tom went to the park with a big red ball.",
             "The sun was warm and the cat slept.", "Lily ate an apple."]


def prompt(query: str, document: str) -> str:
    return f"{PREFIX}<Instruct>: {INSTRUCTION}\n<Query>: {query}\n<Document>: {document}{SUFFIX}"


def main() -> None:
    os.makedirs(OUT, exist_ok=True)
    tok = Tokenizer.from_file(TOKENIZER)
    tok.add_tokens(["yes", "no"])
    tok.save(os.path.join(OUT, "tokenizer.json"))
    with open(os.path.join(OUT, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>",
                   "eos_token": "</s>", "unk_token": "<unk>"}, f)
    vocab = tok.get_vocab_size()
    config = transformers.Qwen3Config(
        vocab_size=vocab, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=512,
        rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=2, tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    torch.manual_seed(7)
    model = transformers.Qwen3ForCausalLM(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_((1 + 0.3 * torch.randn_like(p)) if name.endswith("norm.weight")
                    else torch.randn_like(p) * 1.5 / p.shape[-1] ** 0.5)
            p.copy_(p.half().float())
    model.save_pretrained(OUT)
    yes, no = tok.token_to_id("yes"), tok.token_to_id("no")
    ids, scores = [], []
    with torch.no_grad():
        for document in DOCUMENTS:
            encoded = tok.encode(prompt(QUERY, document)).ids  # (stories' post-processor: BOS)
            logits = model(torch.tensor([encoded])).logits[0, -1].double()
            pair = torch.softmax(torch.stack([logits[no], logits[yes]]), 0)
            ids.append(encoded)
            scores.append(float(pair[1]))
    with open(os.path.join(OUT, "expected.json"), "w") as f:
        json.dump({"query": QUERY, "documents": DOCUMENTS, "instruction": INSTRUCTION,
                   "prompt_ids": ids, "scores": scores}, f)
    print("scores", [round(s, 4) for s in scores], "yes/no ids", yes, no)


if __name__ == "__main__":
    main()
