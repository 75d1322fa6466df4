import pytest

import gguf_writer
from helpers import write_tiny_model
from tinypaged.tokenizer import Tokenizer

MULTI_BYTE = "naïve café — 日本語 🙂👍🏽 done"


@pytest.fixture
def tok(tiny_model_dir):
    return Tokenizer(tiny_model_dir)


def test_round_trip_with_multi_byte_text(tok):
    ids = tok.encode(MULTI_BYTE)
    assert len(ids) > len(MULTI_BYTE)  # byte-level: characters span several tokens
    assert tok.decode(ids) == MULTI_BYTE


def test_streaming_never_emits_a_broken_character(tok):
    ids = tok.encode(MULTI_BYTE)
    detok = tok.detokenizer()
    deltas = [detok.push(i) for i in ids] + [detok.flush()]
    assert "".join(deltas) == MULTI_BYTE
    assert not any("\ufffd" in d for d in deltas)
    assert deltas.count("") >= 5  # the emoji's bytes were held back until complete


def test_flush_drops_a_character_cut_short_at_the_end(tok):
    ids = tok.encode("ok 🙂")
    detok = tok.detokenizer()
    pushed = "".join(detok.push(i) for i in ids[:-1])  # the emoji's last byte never comes
    assert pushed + detok.flush() == "ok "
    assert tok.decode(ids[:-1]).endswith("\ufffd")  # what it would have shown


def test_the_chat_template_adds_its_default_system_prompt(tok):
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}])
    assert text == ("<|im_start|>system\nYou are a tiny test model.<|im_end|>\n"
                    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    own = tok.apply_chat_template([{"role": "system", "content": "Be brief."},
                                   {"role": "user", "content": "hi"}], add_generation_prompt=False)
    assert own == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
    assert tok.encode("<|im_start|>")[0] == 1 and tok.eos_token_id == 2


def test_chat_errors(tok, tmp_path):
    with pytest.raises(ValueError, match="message 0 needs a 'role'"):
        tok.apply_chat_template([{"role": 5, "content": "hi"}])
    with pytest.raises(ValueError, match="message 1 content must be text or a list of parts"):
        tok.apply_chat_template([{"role": "user", "content": "hi"}, {"role": "user", "content": 7}])
    with pytest.raises(ValueError, match="message 0 content part 0 must be"):
        tok.apply_chat_template([{"role": "user", "content": ["hi"]}])
    with pytest.raises(ValueError, match="at least one message"):
        tok.apply_chat_template([])
    write_tiny_model(str(tmp_path / "m"))
    (tmp_path / "m" / "tokenizer_config.json").write_text("{}")
    with pytest.raises(ValueError, match="no chat template"):
        Tokenizer(tmp_path / "m").apply_chat_template([{"role": "user", "content": "hi"}])


def test_sentencepiece_style_tokenizer_streams_spaces(stories_dir):
    tok = Tokenizer(stories_dir)
    text = "Once upon a time, there was a little girl named Lily."
    ids = tok.encode(text)
    assert ids[0] == 1  # its post-processor adds BOS
    detok = tok.detokenizer()
    assert "".join(detok.push(i) for i in ids) + detok.flush() == text


def test_a_long_text_is_encoded_by_the_call_that_lets_other_threads_run(stories_dir):
    """tokenizers' encode keeps the GIL (a 4 MB /tokenize held the server's event loop
    2.7 s); encode_batch lets go of it. A long text takes that path, to the same ids."""
    from tinypaged.formats.hf_tokens import LONG_TEXT

    tok = Tokenizer(stories_dir)
    calls = []

    class Spy:  # the Rust tokenizer's attributes cannot be patched: wrap it
        def __init__(self, inner):
            self.inner = inner

        def __getattr__(self, name):
            calls.append(name)
            return getattr(self.inner, name)
    text = "Once upon a time, a little dog ran to the park. " * (LONG_TEXT // 40)
    inner = tok._tok._tok
    expected = inner.encode(text, add_special_tokens=True).ids
    tok._tok._tok = Spy(inner)
    assert tok.encode(text) == expected and calls == ["encode_batch"]
    assert tok.decode(expected) == inner.decode(expected) and calls[-1] == "decode_batch"
    calls.clear()
    assert tok.encode("Once upon a time") == inner.encode("Once upon a time").ids
    assert calls == ["encode"]


@pytest.mark.parametrize("source", ["sentencepiece", "byte-level", "gguf", "gguf-sentencepiece"])
def test_the_size_bound_never_exceeds_the_real_token_count(source, stories_dir, tmp_path, request):
    """check_fits refuses from a text's bytes alone: its bound (bytes over the longest
    token's) must stay at or under the tokens the text really has, on texts built to
    make tokens long (the longest token's own text repeated) and on random mixes."""
    import random
    if source == "byte-level":
        write_tiny_model(str(tmp_path))
    if source == "gguf-sentencepiece":  # (formats/sentencepiece_bpe.py's pieces)
        gguf_writer.sentencepiece_vocab_gguf(tmp_path / "spm.gguf", add_space_prefix=True,
                                             added=(("\n", 4), ("<ctl>", 3)))
    path = {"sentencepiece": stories_dir, "byte-level": tmp_path,
            "gguf-sentencepiece": tmp_path / "spm.gguf"}.get(source) \
        or request.getfixturevalue("smollm2_gguf")
    tok = Tokenizer(path)
    longest = tok._tok.text_bytes_bound()
    tok.check_fits("xx", 2)  # (measures the vocabulary)
    vocab = tok.vocab()
    texts = [tok.decode([i], skip_special_tokens=False) * 50 for i in
             sorted(vocab.values(), key=lambda i: -len(tok.token_bytes(i)))[:20]]
    rng = random.Random(0)
    alphabet = "ab é\n\t  ▁中文🙂" + "".join(chr(rng.randrange(32, 0x2FFF)) for _ in range(40))
    texts += ["".join(rng.choice(alphabet) for _ in range(rng.randrange(1, 3000))) for _ in range(30)]
    for text in texts:
        fewest = len(text.encode("utf-8")) // tok._longest_token_bytes
        assert fewest <= len(tok.encode(text, add_special_tokens=False)), (source, longest, text[:40])


def test_a_text_far_too_long_is_refused_before_it_is_tokenized(stories_dir, monkeypatch):
    from tinypaged import LLM
    llm = LLM(stories_dir)
    tok = llm.engine.tokenizer
    monkeypatch.setattr(tok, "_ids", lambda *a: pytest.fail("tokenized"))
    with pytest.raises(ValueError, match=r"prompt has at least \d+ tokens \(\d+ bytes of text\); "
                                         r"max_model_len is \d+ tokens"):
        llm.generate("once upon a time " * 20000)
    with pytest.raises(ValueError, match="at least"):
        tok.chat_ids([{"role": "user", "content": "x" * 100000}], max_model_len=512) \
            if tok.chat_template else tok.check_fits("x" * 100000, 512)
