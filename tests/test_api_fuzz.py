"""Random misuse of the library API (hypothesis): prompts of every type, SamplingParams
fields and engine options, valid and invalid values mixed. Every case ends in a
clear TypeError or ValueError before any work, or in a completed generation; after
every case the pool is whole and a plain greedy request still gets its answer."""
import math
import re

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from tinypaged import LLM, SamplingParams
from tinypaged.config import EngineConfig
from tinypaged.outputs import KV_CACHE_FULL

GREEDY = SamplingParams(temperature=0, max_tokens=6)
FINISH_REASONS = {"stop", "length", KV_CACHE_FULL}
# what a message looks like when Python, not our check, found the mistake
UNCLEAR = re.compile(r"not iterable|not supported between|unhashable|has no attribute|"
                     r"invalid literal|object is not|argument must be|takes \d+ positional")
FUZZ = settings(max_examples=500, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


def maybe(valid, *invalid):
    """A field's value: valid nine times in ten, else one of the invalid ones (so that a
    fair share of cases, with several fields, is entirely valid and runs)."""
    return st.one_of(*[valid] * 9, st.sampled_from(invalid))


token_ids = st.lists(st.integers(-3, 520), min_size=0, max_size=24)
good_ids = st.lists(st.integers(0, 511), min_size=1, max_size=24)
one_prompt = st.one_of(
    st.sampled_from(["Once upon a time", "The dog ran", "Hi", "é ’ 🙂"]),
    good_ids,
    good_ids.map(tuple),
    good_ids.map(lambda ids: np.array(ids, dtype=np.int64)),
    good_ids.map(lambda ids: {"prompt_token_ids": ids}),
    st.just({"prompt": "Once"}),
    token_ids,  # maybe empty, maybe out of the vocabulary
    st.lists(st.integers(1, 500), min_size=1, max_size=8).map(lambda ids: np.array(ids, np.float32)),
    st.sampled_from(["", "bad \ud800 text", {"text": "hi"}, {"prompt": 5}, None, 1.5, 7, True,
                     b"Once", [1, "a"], [1, 2.5], [True, 3]]),
)
prompts = st.one_of(one_prompt, st.lists(one_prompt, min_size=1, max_size=3))

penalty = st.floats(-2, 2)
params = st.fixed_dictionaries({}, optional={
    "max_tokens": maybe(st.one_of(st.integers(1, 12), st.just(np.int64(3))), 0, -1, True, 3.0, "4"),
    "temperature": maybe(st.one_of(st.floats(0, 2), st.just(1e-320)), -0.5, math.inf, math.nan,
                         "0.5", True),
    "top_k": maybe(st.integers(0, 40), -1, 2.5, None),
    "top_p": maybe(st.floats(0.05, 1), 0, 1.2, math.nan, "1"),
    "min_p": maybe(st.floats(0, 1), -0.1, 1.1, math.inf),
    "repetition_penalty": maybe(st.floats(0.5, 2), 0, -0.5, math.nan),
    "seed": maybe(st.one_of(st.none(), st.integers(0, 2 ** 40)), -1, True, 1.0),
    "n": maybe(st.one_of(st.integers(1, 4), st.just(np.int32(2))), 0, True, 2.0),
    "stop": maybe(st.lists(st.sampled_from(["the", "dog", ".", "\n"]), max_size=2), 5, [""],
                  ["a\udc80"], None),
    "stop_token_ids": maybe(st.lists(st.integers(0, 511), max_size=2), 3, [True], ["2"], [-1], [600]),
    "ignore_eos": maybe(st.booleans(), "no", 1, None),
    "presence_penalty": maybe(penalty, "0", math.nan, 2.5),
    "frequency_penalty": maybe(penalty, math.inf, -3),
    "logit_bias": maybe(st.dictionaries(st.integers(0, 511), st.floats(-100, 100), max_size=2),
                        [1, 2], {"1": 2.0}, {3: math.nan}, {-1: 1.0}, {600: 1.0}, {3: 150.0}),
    "logprobs": maybe(st.one_of(st.none(), st.integers(0, 20)), True, 2.5, -1, 21),
    "prompt_logprobs": maybe(st.one_of(st.none(), st.integers(0, 20)), "3", -1, 25),
})
calls = st.sampled_from(["generate", "stream", "submit", "beam_search"])


@pytest.fixture(scope="module")
def llm(stories_dir):
    # a small pool, so that preemption and sequences the pool cannot hold come up
    with LLM(stories_dir, backend="cpu", block_size=8, num_blocks=24, max_num_seqs=8) as llm:
        yield llm


@pytest.fixture(scope="module")
def expected(llm):
    return llm.generate("Once upon a time", GREEDY)[0].outputs[0].token_ids


def assert_clear(error: Exception) -> None:
    assert isinstance(error, (TypeError, ValueError)), repr(error)
    assert str(error) and not UNCLEAR.search(str(error)), repr(error)


def call(llm, kind: str, prompt, sampling: SamplingParams):
    """Run one request the way `kind` does; returns the RequestOutputs (or beams)."""
    if kind == "generate":
        return llm.generate(prompt, sampling)
    if kind == "stream":
        text = "".join(llm.stream(prompt, sampling))
        return [text]
    if kind == "submit":
        return [llm.submit(prompt, sampling).result()]
    return llm.beam_search(prompt, sampling.n, max_tokens=sampling.max_tokens,
                           ignore_eos=sampling.ignore_eos)


def check_output(kind: str, outputs, sampling: SamplingParams) -> None:
    if kind == "stream":
        assert isinstance(outputs[0], str)
        return
    for out in outputs:
        if kind == "beam_search":
            assert 1 <= len(out.beams) <= sampling.n
            assert all(len(b.token_ids) <= sampling.max_tokens for b in out.beams)
            continue
        assert out.finished and out.error is None
        assert len(out.outputs) == sampling.n
        for sample in out.outputs:
            assert sample.finish_reason in FINISH_REASONS
            assert len(sample.token_ids) <= sampling.max_tokens


@FUZZ
@given(prompt=prompts, fields=params, kind=calls)
def test_random_requests_end_cleanly_and_leave_the_pool_whole(llm, expected, prompt, fields, kind):
    steps_before = llm.stats()["steps"]
    try:
        sampling = SamplingParams(**fields)
        outputs = call(llm, kind, prompt, sampling)
    except (TypeError, ValueError) as e:
        event(f"{kind}: refused, {type(e).__name__}")
        assert_clear(e)
        if "KV pool is too small" not in str(e):  # found by beam search as it grows
            assert llm.stats()["steps"] == steps_before, "work started before the error"
    else:
        event(f"{kind}: completed")
        check_output(kind, outputs, sampling)
    stats = llm.stats()
    assert stats["blocks_used"] == 0 and llm.num_waiting == 0
    assert not llm._loop.call(llm.engine.has_unfinished)
    assert llm.generate("Once upon a time", GREEDY)[0].outputs[0].token_ids == expected


engine_options = st.fixed_dictionaries({}, optional={
    "block_size": maybe(st.sampled_from([1, 4, 16, 32]), 0, 2.0, True, 1 << 20),
    "num_blocks": maybe(st.integers(1, 80), 0, 10 ** 12, 3.5),
    "kv_cache_memory": maybe(st.sampled_from(["1M", "256K", 1 << 20, 65536.0]), "lots", "0",
                             -1, math.inf, "infG", "100T"),
    "max_num_seqs": maybe(st.integers(1, 8), 0, True),
    "max_num_batched_tokens": maybe(st.integers(1, 64), 3.5, 0),
    "max_model_len": maybe(st.one_of(st.none(), st.integers(2, 600)), 100.5, 1, "64"),
    "enable_prefix_caching": maybe(st.booleans(), "no", 0),
    "backend": maybe(st.just("cpu"), "gpu", None),
})


@settings(max_examples=60, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(options=engine_options, prompt=one_prompt)
def test_random_engine_options_build_a_working_engine_or_name_the_mistake(stories_dir, options,
                                                                          prompt):
    try:
        EngineConfig(**options)
        llm = LLM(stories_dir, **{"backend": "cpu", **options})
    except (TypeError, ValueError) as e:
        event(f"engine: refused, {type(e).__name__}")
        assert_clear(e)
        return
    with llm:
        try:
            outputs = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=4))
        except (TypeError, ValueError) as e:
            event(f"engine built, request refused, {type(e).__name__}")
            assert_clear(e)
        else:
            event("engine built, request completed")
            check_output("generate", outputs, SamplingParams(max_tokens=4))
        assert llm.stats()["blocks_used"] == 0
        assert llm.generate([1, 400], SamplingParams(temperature=0, max_tokens=1))[0].finished
