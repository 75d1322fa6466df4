"""Rebuild a HF `tokenizer.json` (+ `tokenizer_config.json`) from a GGUF's vocabulary.

Supported:
- `tokenizer.ggml.model = gpt2` (byte-level BPE) with the pre-tokenizers `smollm`
  (GPT-2 regex, each digit split on its own), `gpt2` or `default`, and the split
  patterns of Llama 3 (`llama-bpe`: digits in threes), Qwen2 (`qwen2`: digits one
  by one) and GPT-4o (`gpt-4o`, `llama4`: case-aware words);
- `tokenizer.ggml.model = llama` (SentencePiece BPE: Llama 1-2, Gemma), as
  llama.cpp tokenizes it: spaces become "▁" (and one is put first when
  add_space_prefix), then adjacent pieces merge, the pair whose merged piece scores
  highest first; characters outside the vocabulary fall back to their UTF-8 bytes
  (<0xXX> tokens). Expressed as a `tokenizers` BPE whose merges are every split of
  every piece into two pieces, ranked by the whole piece's score. User-defined
  tokens (Gemma's runs of spaces and newlines) match the raw text first.
"""
from __future__ import annotations

from array import array

import json
import os

import numpy as np

from tokenizers import (AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers,
                        processors)

from .gguf import GGUFFile
from .gguf_vocab import (SPACE, TOKEN_CONTROL, TOKEN_NORMAL, TOKEN_USER_DEFINED, bos_of,
                         sentencepiece_arrays, strings, token_types, tokenizer_config)

# How byte-level BPE vocabularies split text into words before merging, by the name
# llama.cpp's converter writes in tokenizer.ggml.pre (the patterns llama.cpp uses)
LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
               r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_CASED = r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]"
_LOWER = r"[\p{Ll}\p{Lm}\p{Lo}\p{M}]"
_CONTRACTION = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
GPT4O_SPLIT = (rf"[^\r\n\p{{L}}\p{{N}}]?{_CASED}*{_LOWER}+{_CONTRACTION}"
               rf"|[^\r\n\p{{L}}\p{{N}}]?{_CASED}+{_LOWER}*{_CONTRACTION}"
               r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
SPLITS = {**dict.fromkeys(("llama-bpe", "llama3", "llama-v3", "smaug-bpe", "dbrx", "falcon3"),
                          LLAMA3_SPLIT),
          **dict.fromkeys(("qwen2", "deepseek-r1-qwen", "megrez"), QWEN2_SPLIT),
          **dict.fromkeys(("gpt-4o", "llama4"), GPT4O_SPLIT)}
SUPPORTED_PRE = ("smollm", "gpt2", "default", *SPLITS)


def _add_special_and_user_tokens(tokenizer: Tokenizer, tokens: list[str], types: list[int]) -> None:
    tokenizer.add_special_tokens([
        AddedToken(tok, special=True, normalized=False)
        for tok, t in zip(tokens, types) if t == TOKEN_CONTROL])
    tokenizer.add_tokens([
        AddedToken(tok, special=False, normalized=False)
        for tok, t in zip(tokens, types) if t == TOKEN_USER_DEFINED])


def sentencepiece_merges(tokens: list[str], scores, types: list[int]) -> list[tuple[str, str]]:
    """Every split of a normal piece into two pieces of the vocabulary, best first: by
    the whole piece's score (llama.cpp merges the best-scoring pair first), then by
    its place in the vocabulary, then by its left part's. The candidates are kept as
    int32 ids and the pairs reuse the vocabulary's strings: Gemma 3's 513,511 merges
    as tuples of fresh slices took 170 MB at load."""
    index = {tok: i for i, tok in enumerate(tokens)}
    whole, lefts, rights = array("i"), array("i"), array("i")
    for i, tok in enumerate(tokens):
        if types[i] != TOKEN_NORMAL or len(tok) < 2:
            continue
        for k in range(1, len(tok)):
            left, right = index.get(tok[:k]), index.get(tok[k:])
            if left is not None and right is not None:
                whole.append(i)
                lefts.append(left)
                rights.append(right)
    whole, lefts, rights = (np.frombuffer(a, dtype=np.int32) for a in (whole, lefts, rights))
    score = -np.asarray(scores, dtype=np.float64)[whole]
    order = np.lexsort((lefts, whole, score))  # the last key sorts first
    return [(tokens[left], tokens[right]) for left, right in zip(lefts[order].tolist(),
                                                                rights[order].tolist())]


def build_sentencepiece(gguf: GGUFFile) -> Tokenizer:
    tokens, types, scores = sentencepiece_arrays(gguf)
    unknown = gguf.get("tokenizer.ggml.unknown_token_id")
    unk = tokens[int(unknown)] if unknown is not None and 0 <= int(unknown) < len(tokens) else None
    tokenizer = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)},
                                     merges=sentencepiece_merges(tokens, scores, types),
                                     byte_fallback=True, unk_token=unk, fuse_unk=True))
    prefix = gguf.get("tokenizer.ggml.add_space_prefix", True) is True
    spaces = normalizers.Replace(" ", SPACE)
    tokenizer.normalizer = normalizers.Sequence([normalizers.Prepend(SPACE), spaces]) if prefix \
        else spaces
    steps = [decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
    if prefix:
        steps.append(decoders.Strip(" ", 1, 0))
    tokenizer.decoder = decoders.Sequence(steps)
    bos = bos_of(gguf, tokens)
    if bos is not None:
        tokenizer.post_processor = processors.TemplateProcessing(
            single=f"{bos[0]} $A", pair=f"{bos[0]} $A $B", special_tokens=[bos])
    _add_special_and_user_tokens(tokenizer, tokens, types)
    return tokenizer


def build_tokenizer(gguf: GGUFFile) -> Tokenizer:
    model = gguf.require("tokenizer.ggml.model")
    if model == "llama":
        return build_sentencepiece(gguf)
    if model != "gpt2":
        raise ValueError(f"{gguf.path}: tokenizer model {model!r} is not supported "
                         f"(supported: 'gpt2' byte-level BPE, 'llama' SentencePiece)")
    pre = gguf.get("tokenizer.ggml.pre", "default")
    if pre not in SUPPORTED_PRE:
        raise ValueError(f"{gguf.path}: pre-tokenizer {pre!r} is not supported "
                         f"(supported: {', '.join(SUPPORTED_PRE)})")
    tokens = strings(gguf, "tokenizer.ggml.tokens")
    types = token_types(gguf, tokens)
    merges = [tuple(m.split(" ", 1)) for m in strings(gguf, "tokenizer.ggml.merges")]
    if any(len(m) != 2 for m in merges):
        raise ValueError(f"{gguf.path}: malformed BPE merge in tokenizer.ggml.merges")

    vocab = {tok: i for i, tok in enumerate(tokens)}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre == "smollm":
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Digits(individual_digits=True), byte_level])
    elif pre in SPLITS:  # the words by the family's own pattern, then bytes as characters
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(SPLITS[pre]), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    else:
        tokenizer.pre_tokenizer = byte_level
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    bos = bos_of(gguf, tokens)
    if bos is not None:
        tokenizer.post_processor = processors.Sequence([
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(single=f"{bos[0]} $A", pair=f"{bos[0]} $A $B",
                                          special_tokens=[bos])])
    _add_special_and_user_tokens(tokenizer, tokens, types)
    return tokenizer


def write_tokenizer_files(gguf: GGUFFile, out_dir: str) -> None:
    """tokenizer.json and tokenizer_config.json (chat template, BOS/EOS) into out_dir."""
    build_tokenizer(gguf).save(os.path.join(out_dir, "tokenizer.json"))
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(tokenizer_config(gguf), f, indent=2, ensure_ascii=False)
