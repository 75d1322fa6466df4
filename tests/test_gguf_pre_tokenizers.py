"""Byte-level BPE vocabularies of the families whose GGUF files name their own
pre-tokenizer (Llama 3's llama-bpe, Qwen2's qwen2, GPT-4o's): split and merged as
transformers' own GGUF conversion does (tools/make_tokenizer_fixtures.py), and an
unknown name refused by name; and a SentencePiece vocabulary with Llama 2's leading
space."""
import json
from pathlib import Path

import pytest

import gguf_writer as gw
from tinypaged.tokenizer import Tokenizer

EXPECTED = json.loads((Path(__file__).parent / "fixtures" / "pre_tokenizers.json").read_text())


@pytest.mark.parametrize("pre", list(EXPECTED))
def test_a_vocabulary_splits_and_merges_as_its_family_does(pre, tmp_path):
    """Byte-level BPE by its pre-tokenizer name; "spm-prefix-true": a SentencePiece
    vocabulary with the leading space (Llama 2's), merged by its pieces' scores."""
    path = tmp_path / f"{pre}.gguf"
    if pre.startswith("spm-"):
        gw.sentencepiece_vocab_gguf(path, add_space_prefix=True)
    else:
        gw.byte_level_vocab_gguf(path, pre)
    tokenizer = Tokenizer(path)
    for case in EXPECTED[pre]:
        ids = tokenizer.encode(case["text"], add_special_tokens=False)
        assert ids == case["ids"], case["text"]
        assert tokenizer.decode(ids) == case["text"]


def test_the_families_split_differently():
    """(So the test above tells them apart: Qwen2 splits digits one by one, Llama 3
    in threes.)"""
    first = {pre: cases[0]["ids"] for pre, cases in EXPECTED.items() if not pre.startswith("spm-")}
    assert first["qwen2"] != first["llama-bpe"]


def test_an_unknown_pre_tokenizer_is_refused_by_name(tmp_path):
    gw.byte_level_vocab_gguf(tmp_path / "x.gguf", "some-new-family")
    with pytest.raises(ValueError, match="pre-tokenizer 'some-new-family' is not supported"):
        Tokenizer(tmp_path / "x.gguf")


def test_sentencepiece_puts_its_leading_space_before_leading_spaces_too(tmp_path):
    """llama.cpp (and SentencePiece's add_dummy_prefix) prefix "▁" even to a text that
    opens with spaces: "  hello" is ▁ ▁ ▁hello. (transformers' Metaspace leaves it out
    there, so this case is not in its fixture.)"""
    gw.sentencepiece_vocab_gguf(tmp_path / "spm.gguf", add_space_prefix=True)
    tokenizer = Tokenizer(tmp_path / "spm.gguf")
    ids = tokenizer.encode("  hello", add_special_tokens=False)
    assert [tokenizer._tok.id_to_token(i) for i in ids] == ["\u2581", "\u2581", "\u2581hello"]
    assert tokenizer.decode(ids) == "  hello"
