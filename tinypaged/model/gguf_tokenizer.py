"""Rebuild a HF `tokenizer.json` (+ `tokenizer_config.json`) from a GGUF's vocabulary.

Supported: `tokenizer.ggml.model = gpt2` (byte-level BPE) with the pre-tokenizers
`smollm` (GPT-2 regex, each digit split on its own), `gpt2` or `default`.
"""
from __future__ import annotations

import json
import os

import numpy as np

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

from .gguf import GGUFFile

# GGUF token types (llama.cpp's llama_token_type)
TOKEN_NORMAL, TOKEN_CONTROL, TOKEN_USER_DEFINED = 1, 3, 4
SUPPORTED_PRE = ("smollm", "gpt2", "default")


def _strings(gguf: GGUFFile, key: str) -> list[str]:
    values = gguf.require(key)
    if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
        raise ValueError(f"{gguf.path}: {key} must be an array of strings")
    return values


def build_tokenizer(gguf: GGUFFile) -> Tokenizer:
    model = gguf.require("tokenizer.ggml.model")
    if model != "gpt2":
        raise ValueError(f"{gguf.path}: tokenizer model {model!r} is not supported "
                         f"(supported: 'gpt2' byte-level BPE)")
    pre = gguf.get("tokenizer.ggml.pre", "default")
    if pre not in SUPPORTED_PRE:
        raise ValueError(f"{gguf.path}: pre-tokenizer {pre!r} is not supported "
                         f"(supported: {', '.join(SUPPORTED_PRE)})")
    tokens = _strings(gguf, "tokenizer.ggml.tokens")
    types = gguf.get("tokenizer.ggml.token_type")
    if types is None:
        types = [TOKEN_NORMAL] * len(tokens)
    elif not isinstance(types, np.ndarray) or types.dtype.kind not in "iu" or len(types) != len(tokens):
        raise ValueError(f"{gguf.path}: tokenizer.ggml.token_type must be {len(tokens)} integers")
    merges = [tuple(m.split(" ", 1)) for m in _strings(gguf, "tokenizer.ggml.merges")]
    if any(len(m) != 2 for m in merges):
        raise ValueError(f"{gguf.path}: malformed BPE merge in tokenizer.ggml.merges")

    vocab = {tok: i for i, tok in enumerate(tokens)}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre == "smollm":
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Digits(individual_digits=True), byte_level])
    else:
        tokenizer.pre_tokenizer = byte_level
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    if gguf.get("tokenizer.ggml.add_bos_token", False) is True \
            and gguf.get("tokenizer.ggml.bos_token_id") is not None:
        bos_id = gguf.integer("tokenizer.ggml.bos_token_id")
        if not 0 <= bos_id < len(tokens):
            raise ValueError(f"{gguf.path}: tokenizer.ggml.bos_token_id={bos_id} is not a "
                             f"token id (the vocabulary has {len(tokens)})")
        bos = tokens[bos_id]
        tokenizer.post_processor = processors.Sequence([
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(single=f"{bos} $A", pair=f"{bos} $A $B",
                                          special_tokens=[(bos, bos_id)])])
    tokenizer.add_special_tokens([
        AddedToken(tok, special=True, normalized=False)
        for tok, t in zip(tokens, types) if t == TOKEN_CONTROL])
    tokenizer.add_tokens([
        AddedToken(tok, special=False, normalized=False)
        for tok, t in zip(tokens, types) if t == TOKEN_USER_DEFINED])
    return tokenizer


def write_tokenizer_files(gguf: GGUFFile, out_dir: str) -> None:
    """tokenizer.json and tokenizer_config.json (chat template, BOS/EOS) into out_dir."""
    build_tokenizer(gguf).save(os.path.join(out_dir, "tokenizer.json"))
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(tokenizer_config(gguf), f, indent=2, ensure_ascii=False)


def tokenizer_config(gguf: GGUFFile) -> dict:
    """What HF keeps in tokenizer_config.json: special tokens and the chat template."""
    tokens = gguf.require("tokenizer.ggml.tokens")

    def token_at(key: str) -> str | None:
        if gguf.get(key) is None:
            return None
        i = gguf.integer(key)
        return tokens[i] if 0 <= i < len(tokens) else None

    config = {
        "bos_token": token_at("tokenizer.ggml.bos_token_id"),
        "eos_token": token_at("tokenizer.ggml.eos_token_id"),
        "unk_token": token_at("tokenizer.ggml.unknown_token_id"),
        "pad_token": token_at("tokenizer.ggml.padding_token_id"),
        "add_bos_token": gguf.get("tokenizer.ggml.add_bos_token", False) is True,
    }
    template = gguf.get("tokenizer.chat_template")
    if template is not None and not isinstance(template, str):
        raise ValueError(f"{gguf.path}: tokenizer.chat_template must be a string")
    if template is not None:
        config["chat_template"] = template
    return config
