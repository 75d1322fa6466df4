"""What a GGUF's tokenizer metadata says, read and checked: the pieces, their kinds and
scores, BOS, and the tokenizer_config.json fields (special tokens, chat template).
gguf_tokenizer.py builds a `tokenizers` form from it, sentencepiece_bpe.py its own."""
from __future__ import annotations

import numpy as np

from .gguf import GGUFFile

# GGUF token types (llama.cpp's llama_token_type)
TOKEN_NORMAL, TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_USER_DEFINED, TOKEN_BYTE = 1, 2, 3, 4, 6
SPACE = "\u2581"  # SentencePiece's visible space


def strings(gguf: GGUFFile, key: str) -> list[str]:
    values = gguf.require(key)
    if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
        raise ValueError(f"{gguf.path}: {key} must be an array of strings")
    return values


def token_types(gguf: GGUFFile, tokens: list[str]) -> list[int]:
    types = gguf.get("tokenizer.ggml.token_type")
    if types is None:
        return [TOKEN_NORMAL] * len(tokens)
    if not isinstance(types, np.ndarray) or types.dtype.kind not in "iu" or len(types) != len(tokens):
        raise ValueError(f"{gguf.path}: tokenizer.ggml.token_type must be {len(tokens)} integers")
    return types.tolist()


def bos_of(gguf: GGUFFile, tokens: list[str]) -> tuple[str, int] | None:
    """(BOS text, id) when the file asks for BOS to open every prompt."""
    if gguf.get("tokenizer.ggml.add_bos_token", False) is not True \
            or gguf.get("tokenizer.ggml.bos_token_id") is None:
        return None
    bos_id = gguf.integer("tokenizer.ggml.bos_token_id")
    if not 0 <= bos_id < len(tokens):
        raise ValueError(f"{gguf.path}: tokenizer.ggml.bos_token_id={bos_id} is not a "
                         f"token id (the vocabulary has {len(tokens)})")
    return tokens[bos_id], bos_id


def sentencepiece_arrays(gguf: GGUFFile) -> tuple[list[str], list[int], np.ndarray]:
    """A SentencePiece vocabulary's pieces, their kinds and their scores, checked."""
    tokens = strings(gguf, "tokenizer.ggml.tokens")
    types = token_types(gguf, tokens)
    scores = gguf.get("tokenizer.ggml.scores")
    if not isinstance(scores, np.ndarray) or scores.dtype.kind != "f" or len(scores) != len(tokens):
        raise ValueError(f"{gguf.path}: tokenizer.ggml.scores must be {len(tokens)} numbers")
    if sum(t == TOKEN_BYTE for t in types) != 256:
        raise ValueError(f"{gguf.path}: a SentencePiece vocabulary needs its 256 byte tokens "
                         f"(<0x00>..<0xFF>) for the characters it lacks")
    return tokens, types, scores


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
