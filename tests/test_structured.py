"""Structured outputs: the mask kernel against its NumPy spec, the sampler under masks,
StructuredOutputs' checks, and the engine held to JSON schemas, regexes, choices and
GBNF grammars (stories260K here; SmolLM2 in test_structured_smollm2.py)."""
import builtins

import numpy as np
import pytest

from structured_cases import CASES, LABELS, assert_all_valid
from tinypaged import LLM, SamplingParams
from tinypaged.kernels.cpu.token_mask import mask_rows
from tinypaged.kernels.reference import apply_token_mask
from tinypaged.sampling import sample_tokens
from tinypaged.structured import StructuredOutputs
from tinypaged.structured.available import StructuredOutputsUnavailable
from tinypaged.structured.grammar import Grammars
from tinypaged.tokenizer import Tokenizer

PROMPT = "Once upon a time"


def random_masks(rng, rows: int, vocab: int) -> np.ndarray:
    """Words all-allowed, all-refused and mixed, as a JSON grammar's masks have them."""
    words = (vocab + 31) // 32
    masks = rng.integers(-2**31, 2**31, size=(rows, words), dtype=np.int64).astype(np.int32)
    kinds = rng.integers(0, 3, size=(rows, words))
    masks[kinds == 0], masks[kinds == 1] = 0, -1
    return masks


@pytest.mark.parametrize("vocab", [32, 517, 4099])
def test_mask_kernel_matches_the_reference_and_leaves_other_rows_alone(vocab):
    rng = np.random.default_rng(vocab)
    logits = rng.standard_normal((6, vocab)).astype(np.float32)
    which = np.array([4, 1, 2])
    masks = random_masks(rng, 3, vocab)
    got = logits.copy()
    mask_rows(got, which, masks)
    for i, row in enumerate(which):
        np.testing.assert_array_equal(got[row], apply_token_mask(logits[row], masks[i]))
    for row in (0, 3, 5):
        np.testing.assert_array_equal(got[row], logits[row])


def test_masked_rows_sample_only_allowed_tokens_and_free_rows_are_unchanged():
    rng = np.random.default_rng(1)
    vocab = 300
    logits = rng.standard_normal((4, vocab)).astype(np.float32) * 3
    masks = random_masks(rng, 4, vocab)
    params = [SamplingParams(temperature=0), SamplingParams(temperature=0),
              SamplingParams(temperature=1.0), SamplingParams(temperature=0.7, top_p=0.9)]
    for trial in range(20):
        uniforms = list(rng.random(4))
        free = sample_tokens(logits, params, uniforms)
        held = sample_tokens(logits, params, uniforms, masks=[None, masks[1], masks[2], None])
        assert held[0] == free[0] and held[3] == free[3]
        for r in (1, 2):
            allowed = apply_token_mask(logits[r], masks[r]) > -np.inf
            assert allowed[held[r]]
        best = np.where(apply_token_mask(logits[1], masks[1]) > -np.inf, logits[1], -np.inf)
        assert held[1] == int(np.argmax(best))


def test_structured_outputs_checks_what_it_is_given():
    with pytest.raises(ValueError, match="exactly one of"):
        StructuredOutputs()
    with pytest.raises(ValueError, match="exactly one of.*json, regex"):
        StructuredOutputs(json={"type": "object"}, regex="a")
    with pytest.raises(ValueError, match="choice has 0 items"):
        StructuredOutputs(choice=[])
    with pytest.raises(ValueError, match="choice has 10000 items"):
        StructuredOutputs(choice=[f"label {i}" for i in range(10_000)])
    with pytest.raises(ValueError, match="must not be empty"):
        StructuredOutputs(choice=["a", ""])
    with pytest.raises(TypeError, match="choice must be a list"):
        StructuredOutputs(choice="abc")
    with pytest.raises(ValueError, match="not valid JSON"):
        StructuredOutputs(json="{nope")
    with pytest.raises(TypeError, match="json must be a JSON schema"):
        StructuredOutputs(json=[1, 2])
    with pytest.raises(ValueError, match="regex is empty"):
        StructuredOutputs(regex="")
    with pytest.raises(TypeError, match="structured_outputs must be a StructuredOutputs"):
        SamplingParams(structured_outputs="json")
    # a dict is taken as StructuredOutputs' fields; the schema is a copy of its own
    schema = {"type": "object"}
    params = SamplingParams(structured_outputs={"json": schema})
    schema["type"] = "array"
    assert params.structured_outputs.json == {"type": "object"}


def test_without_llguidance_a_constraint_names_the_extra(monkeypatch):
    real_import = builtins.__import__

    def no_llguidance(name, *args, **kwargs):
        if name.startswith("llguidance"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)
    monkeypatch.setattr(builtins, "__import__", no_llguidance)
    with pytest.raises(StructuredOutputsUnavailable, match=r"pip install 'tinypaged\[structured\]'"):
        StructuredOutputs(regex="[a-z]+")


@pytest.fixture(scope="module")
def stories(stories_dir):
    return LLM(stories_dir)


def params_for(kind: str, seed: int, **options) -> SamplingParams:
    return SamplingParams(max_tokens=48, temperature=1.0, seed=seed,
                          structured_outputs=CASES[kind][0], **options)


@pytest.mark.parametrize("kind", sorted(CASES))
def test_50_samples_at_temperature_1_all_match(stories, kind):
    outputs = stories.generate([PROMPT] * 50, [params_for(kind, seed) for seed in range(50)])
    assert_all_valid(outputs, kind, stories.engine)
    assert len({o.text for o in outputs}) > 1  # seeds differ, and so do the samples


def test_n_4_forks_the_matcher_with_each_sample(stories):
    outputs = stories.generate([PROMPT] * 4 * len(CASES),
                               [params_for(kind, seed, n=4) for kind in sorted(CASES)
                                for seed in range(4)])
    for i, kind in enumerate(sorted(CASES)):
        batch = outputs[4 * i:4 * i + 4]
        assert all(len(o.outputs) == 4 for o in batch)
        assert_all_valid(batch, kind, stories.engine)


def test_under_preemption_samples_still_match(stories_dir):
    """A pool of 12 blocks for 16 growing samples: sequences are preempted and
    recomputed, keeping their tokens, and their matchers with them."""
    llm = LLM(stories_dir, num_blocks=12, enable_prefix_caching=False)
    for kind in sorted(CASES):
        outputs = llm.generate([PROMPT * 3] * 16, [params_for(kind, seed) for seed in range(16)])
        assert_all_valid(outputs, kind, llm.engine)
    assert llm.stats()["preemptions"] > 0
    assert llm.stats()["blocks_used"] == 0


def test_a_batch_mixed_with_free_requests(stories):
    """Constrained and free samples in one batch: the free ones come out as they do
    alone (greedy, so bit for bit)."""
    free = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
    alone = stories.generate([PROMPT] * 4, free)
    kinds = sorted(CASES)
    params = [free if i % 2 else params_for(kinds[i // 2 % len(kinds)], i) for i in range(16)]
    outputs = stories.generate([PROMPT] * 16, params)
    for i in range(1, 16, 2):
        assert outputs[i].token_ids == alone[0].token_ids
    for i in range(0, 16, 2):
        assert_all_valid([outputs[i]], kinds[i // 2 % len(kinds)], stories.engine)


def test_a_stop_string_ends_only_where_the_grammar_may_end(stories):
    """The only choice holds the stop string ","; cutting there would leave "x" (no
    match), so the sample goes on to the end of the choice."""
    params = SamplingParams(max_tokens=16, temperature=0, stop=[","],
                            structured_outputs=StructuredOutputs(choice=["x,y"]))
    out = stories.generate(PROMPT, params)[0]
    assert (out.text, out.finish_reason) == ("x,y", "stop")
    # where the text before it is a whole match, the stop string ends the sample
    params.structured_outputs = StructuredOutputs(regex="[a-z]+(,[a-z]+)?")
    params.stop = [","]
    for out in stories.generate([PROMPT] * 8, [SamplingParams(
            max_tokens=16, seed=s, stop=[","], structured_outputs=params.structured_outputs)
            for s in range(8)]):
        assert "," not in out.text and out.text.isalpha(), out.text


@pytest.mark.parametrize("structured, message", [
    ({"regex": "("}, "unclosed group"),
    ({"regex": r"[^\s\S]"}, "matches no output"),
    ({"json": {"type": "nope"}}, "nope"),
    ({"json": {"type": "object", "properties": {"a": {"$ref": "#/nowhere"}}}}, "nowhere"),
    ({"grammar": "root ::= item\n"}, "item"),
    ({"grammar": "start: (("}, "grammar"),
])
def test_a_bad_constraint_is_a_value_error_and_leaves_nothing_behind(stories, structured, message):
    engine = stories.engine
    with pytest.raises(ValueError, match=message):
        stories.generate(PROMPT, SamplingParams(structured_outputs=structured))
    assert stories.stats()["blocks_used"] == 0 and not engine.requests
    out = stories.generate(PROMPT, SamplingParams(max_tokens=16, structured_outputs={"choice": LABELS}))
    assert out[0].text in LABELS


def test_grammars_are_compiled_once_per_text(stories):
    grammars = stories.engine.grammars
    first = grammars.compile(StructuredOutputs(choice=["a", "b"]))
    assert grammars.compile(StructuredOutputs(choice=["a", "b"])) is first
    assert grammars.compile(StructuredOutputs(choice=["a", "c"])) is not first


@pytest.mark.parametrize("source", ["sentencepiece", "gguf"])
def test_forced_text_is_tokenized_as_the_model_would(source, stories_dir, request):
    """llguidance forces a grammar's fixed text as the tokenizer's own tokens: no
    SentencePiece leading space (stories260K), and the byte-level BPE vocabulary a
    GGUF file carries (SmolLM2's)."""
    path = stories_dir if source == "sentencepiece" else request.getfixturevalue("smollm2_gguf")
    tokenizer = Tokenizer(path)
    grammars = Grammars(tokenizer, tokenizer.vocab_size, [2], cache_bytes=64 << 20)
    state = grammars.start(StructuredOutputs(regex="once upon"))
    allowed = np.flatnonzero(apply_token_mask(np.zeros(tokenizer.vocab_size, np.float32),
                                              grammars.fill_masks([state])[0]) == 0)
    assert len(allowed) >= 1 and all(b"once upon".startswith(tokenizer.token_bytes(int(t)))
                                     for t in allowed), [tokenizer.token_bytes(int(t)) for t in allowed]


@pytest.mark.cuda
def test_on_the_cuda_backend_samples_match_too(cuda_model_dir):
    """The GPU keeps logits on the device and fetches candidates; a constrained row is
    fetched whole and masked on the host. The simulator takes seconds a step, so one
    batch of a one-token constraint of each kind, sampled, beside a free request."""
    import json
    import re
    llm = LLM(cuda_model_dir, backend="cuda", num_blocks=64)
    assert llm.engine.backend_name == "cuda"
    checks = [(StructuredOutputs(json={"type": "integer", "minimum": 0, "maximum": 9}),
               lambda t: json.loads(t) in range(10)),
              (StructuredOutputs(regex="[0-9]"), lambda t: re.fullmatch("[0-9]", t)),
              (StructuredOutputs(choice=["x", "y"]), lambda t: t in ("x", "y")),
              (StructuredOutputs(grammar='root ::= "a" | "b"'), lambda t: t in ("a", "b"))]
    params = [SamplingParams(max_tokens=4, temperature=1.0, seed=i, structured_outputs=so)
              for i, (so, _) in enumerate(checks)]
    outputs = llm.generate([PROMPT] * 5, params + [SamplingParams(max_tokens=1, temperature=0)])
    for out, (so, check) in zip(outputs, checks):
        assert out.outputs[0].finish_reason == "stop" and check(out.text), (so, out.text)
        assert llm.engine.grammars.compile(so).accepts(out.text)
    assert len(outputs[4].token_ids) == 1
