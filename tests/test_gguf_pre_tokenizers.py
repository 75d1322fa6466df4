"""Byte-level BPE vocabularies of the families whose GGUF files name their own
pre-tokenizer (Llama 3's llama-bpe, Qwen2's qwen2, GPT-4o's): split and merged as
transformers' own GGUF conversion does (tools/make_tokenizer_fixtures.py), and an
unknown name refused by name."""
import json
from pathlib import Path

import pytest

import gguf_writer as gw
from tinypaged.tokenizer import Tokenizer

EXPECTED = json.loads((Path(__file__).parent / "fixtures" / "pre_tokenizers.json").read_text())


@pytest.mark.parametrize("pre", list(EXPECTED))
def test_a_byte_level_vocabulary_splits_as_its_family_does(pre, tmp_path):
    path = tmp_path / f"{pre}.gguf"
    gw.byte_level_vocab_gguf(path, pre)
    tokenizer = Tokenizer(path)
    for case in EXPECTED[pre]:
        ids = tokenizer.encode(case["text"], add_special_tokens=False)
        assert ids == case["ids"], case["text"]
        assert tokenizer.decode(ids) == case["text"]


def test_the_families_split_differently():
    """(So the test above tells them apart: Qwen2 splits digits one by one, Llama 3
    in threes.)"""
    first = {pre: cases[0]["ids"] for pre, cases in EXPECTED.items()}
    assert first["qwen2"] != first["llama-bpe"]


def test_an_unknown_pre_tokenizer_is_refused_by_name(tmp_path):
    gw.byte_level_vocab_gguf(tmp_path / "x.gguf", "some-new-family")
    with pytest.raises(ValueError, match="pre-tokenizer 'some-new-family' is not supported"):
        Tokenizer(tmp_path / "x.gguf")
