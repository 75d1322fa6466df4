"""SentencePieceBPE (formats/sentencepiece_bpe.py) against the `tokenizers` BPE that
gguf_tokenizer.build_sentencepiece rebuilds from the same GGUF vocabulary: the same ids
for every text, the same text for every list of ids, on random mixes of the
vocabulary's own pieces, spaces, added pieces, characters outside it, and Gemma 3's
real vocabulary. A vocabulary it cannot read that way falls back to the `tokenizers`
form."""
import random

import pytest

import gguf_writer as gw
from tinypaged.formats import sentencepiece_kernels
from tinypaged.formats.gguf import GGUFFile
from tinypaged.formats.gguf_tokenizer import build_tokenizer
from tinypaged.formats.hf_tokens import HFTokens
from tinypaged.formats.sentencepiece_bpe import SentencePieceBPE
from tinypaged.tokenizer import Tokenizer

ADDED = (("<start_of_turn>", 3), ("<end_of_turn>", 3), ("\n", 4), ("\n\n", 4), ("  ", 4),
         ("\t", 4), ("[multimodal]", 4))
ALPHABET = list(" \n\t abcdehilnorstw.,123<>[]é中😀\u200b\u2581")


def random_texts(pieces: list[str], count: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    texts = []
    for _ in range(count):
        parts = []
        for _ in range(rng.randint(1, 12)):
            r = rng.random()
            if r < 0.35:
                parts.append(rng.choice(pieces))
            elif r < 0.45:
                parts.append(rng.choice(pieces).replace("\u2581", " "))
            else:
                parts.append("".join(rng.choice(ALPHABET) for _ in range(rng.randint(1, 8))))
        texts.append("".join(parts))
    return texts + ["", " ", "  ", "\n", "hello world", "  hello", "x<start_of_turn>y"]


def assert_same_as_tokenizers_form(path, count: int) -> None:
    light = Tokenizer(path)
    assert isinstance(light._tok, SentencePieceBPE)
    reference = HFTokens(build_tokenizer(GGUFFile.open(path)))
    pieces = [light._tok.id_to_token(i) for i in range(light.vocab_size)]
    rng = random.Random(1)
    for text in random_texts(pieces, count):
        for special in (True, False):
            ids = light.encode(text, add_special_tokens=special)
            assert ids == reference.encode_ids(text, special), text
        noise = [rng.randrange(-2, light.vocab_size + 2) for _ in range(rng.randint(0, 8))]
        for skip in (True, False):
            mixed = noise + ids + noise[:2]
            assert light.decode(mixed, skip) == reference.decode(
                [i for i in mixed if 0 <= i < light.vocab_size], skip), mixed


@pytest.mark.parametrize("prefix", [True, False])
def test_a_small_vocabulary_tokenizes_as_the_tokenizers_form(prefix, tmp_path):
    """With Llama 2's leading space and without it (Gemma's), with control and
    user-defined pieces matched in the raw text first."""
    path = tmp_path / "spm.gguf"
    gw.sentencepiece_vocab_gguf(path, add_space_prefix=prefix, added=ADDED)
    assert_same_as_tokenizers_form(path, 1500)


def test_gemma3_tokenizes_as_the_tokenizers_form(gemma3_gguf):
    """262,144 pieces, 6,249 control and 165 user-defined ones."""
    assert_same_as_tokenizers_form(gemma3_gguf, 600)


def test_the_pieces_answer_as_the_vocabulary_holds_them(tmp_path):
    path = tmp_path / "spm.gguf"
    gw.sentencepiece_vocab_gguf(path, add_space_prefix=True, added=ADDED)
    tok = Tokenizer(path)
    hello = tok._tok.token_to_id("▁hello")
    assert tok._tok.id_to_token(hello) == "▁hello" and tok._tok.token_to_id("nope") is None
    assert tok.token_bytes(hello) == b" hello" and tok.token_bytes(tok._tok.token_to_id("<0xE4>")) == b"\xe4"
    assert tok.special_tokens == {"<s>", "</s>", *(piece for piece, _ in ADDED)}
    assert tok.vocab()["▁hello"] == hello and len(tok.vocab()) == tok.vocab_size
    assert tok.eos_token_id == 2


@pytest.mark.parametrize("trouble", ["a piece twice", "a byte piece's text in a normal piece",
                                     "a byte piece spelled otherwise"])
def test_a_vocabulary_it_cannot_read_so_falls_back_to_the_tokenizers_form(trouble, tmp_path):
    path = tmp_path / "spm.gguf"
    extra = {"a piece twice": ["▁hello"], "a byte piece's text in a normal piece": ["<0x41>he"]}
    gw.sentencepiece_vocab_gguf(path, add_space_prefix=True, pieces=gw.SPM_PIECES + extra.get(trouble, []),
                                byte_piece="<0x{:02x}>" if trouble.endswith("otherwise") else "<0x{:02X}>")
    tok = Tokenizer(path)
    assert isinstance(tok._tok, HFTokens)
    assert tok.encode("hello world") == build_tokenizer(GGUFFile.open(path)).encode("hello world").ids


def test_a_long_text_is_encoded_without_the_gil():
    """(So other threads, the engine loop among them, run while a long prompt is
    tokenized, as the `tokenizers` form's encode_batch allows.)"""
    assert sentencepiece_kernels.encode.targetoptions["nogil"]
