"""Our GGUF tokenizers against llama.cpp's own, on mixed text (whitespace runs, tabs,
accents, CJK, emoji with ZWJ, code, chat markers, numbers and URLs) and on the prose
the perplexity tests read. The ids come from llama-tokenize on the same files
(tools/make_llamacpp_token_fixtures.py -> tests/fixtures/llamacpp_tokens.json)."""
import json
from pathlib import Path

from tinypaged.tokenizer import Tokenizer

FIXTURES = Path(__file__).parent / "fixtures"
LLAMA_CPP = json.loads((FIXTURES / "llamacpp_tokens.json").read_text())
PROSE = (Path(__file__).parent / "data" / "prose.txt").read_text()


def assert_same_as_llama_cpp(tokenizer: Tokenizer, key: str) -> None:
    for text, ids in zip(LLAMA_CPP["texts"], LLAMA_CPP[key]["ids"], strict=True):
        assert tokenizer.encode(text, add_special_tokens=False) == ids, text
    assert tokenizer.encode(PROSE) == LLAMA_CPP[key]["prose_ids"]  # (BOS first where the model has one)


def test_gemma3_tokens_equal_llama_cpps(gemma3_gguf):
    """SentencePiece BPE rebuilt from the file's pieces and scores, byte fallback."""
    assert_same_as_llama_cpp(Tokenizer(gemma3_gguf), "gemma-3-270m")


def test_smollm2_tokens_equal_llama_cpps(smollm2_gguf):
    """The default model's byte-level BPE with the smollm pre-tokenizer."""
    assert_same_as_llama_cpp(Tokenizer(smollm2_gguf), "smollm2-135m")
