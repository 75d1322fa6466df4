"""Bad input: a clear ValueError naming the problem, blocks returned, the others unaffected."""
import pytest

from helpers import write_tiny_model
from tinypaged import LLM, SamplingParams

PARAMS = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    path = tmp_path_factory.mktemp("errors") / "tiny"
    write_tiny_model(str(path), seed=2)  # context 64
    return LLM(path, block_size=4, num_blocks=40)


def test_rejected_requests_leave_the_running_ones_untouched(llm):
    expected = llm.generate([[5, 6, 7], [8, 9]], PARAMS)
    engine = llm.engine
    a = engine.add_request([5, 6, 7], PARAMS)
    engine.step()
    bad = [("", "prompt is empty"), ([], "encodes to no tokens"), ([999], "token id 999 is out of range"),
           ([3] * 64, "prompt has 64 tokens; max_model_len is 64")]
    for prompt, message in bad:
        with pytest.raises(ValueError, match=message):
            engine.add_request(prompt, PARAMS)
    with pytest.raises(TypeError, match="params must be a SamplingParams, got str"):
        engine.add_request("hi", "greedy")
    with pytest.raises(ValueError, match="n=99 exceeds max_num_seqs"):
        engine.add_request([1], SamplingParams(n=99))
    b = engine.add_request([8, 9], PARAMS)
    done = {}
    while engine.has_unfinished():
        for out in engine.step():
            if out.finished:
                done[out.request_id] = out.token_ids
    assert [done[a], done[b]] == [e.token_ids for e in expected]
    assert llm.stats()["blocks_used"] == 0


def test_generate_names_the_bad_prompt_and_runs_nothing(llm):
    with pytest.raises(ValueError, match="prompt 1: prompt is empty"):
        llm.generate(["fine", ""], PARAMS)
    assert not llm.engine.has_unfinished() and llm.stats()["blocks_used"] == 0


def test_prompt_larger_than_the_pool_is_rejected(tmp_path):
    write_tiny_model(str(tmp_path / "m"), max_position_embeddings=512)
    small = LLM(tmp_path / "m", block_size=4, num_blocks=5)
    with pytest.raises(ValueError, match=r"needs \d+ KV blocks; the pool has only 5"):
        small.generate([[3] * 30], PARAMS)
    assert small.generate([[3] * 10], PARAMS)[0].token_ids  # and it still serves others


def test_invalid_sampling_values_and_engine_options(llm, tmp_path):
    with pytest.raises(ValueError, match=r"top_p=2 must be in \(0, 1\]"):
        SamplingParams(top_p=2)
    with pytest.raises(ValueError, match="stop strings must not be empty"):
        SamplingParams(stop=[""])
    with pytest.raises(ValueError, match="block_size=0"):
        LLM(tmp_path, block_size=0)
    with pytest.raises(TypeError):
        LLM(tmp_path, blok_size=16)


def test_abort_mid_generation_returns_blocks_and_spares_the_others(llm):
    expected = llm.generate([[11, 12, 13]], SamplingParams(temperature=0, max_tokens=20,
                                                           ignore_eos=True))[0]
    engine = llm.engine
    victim = engine.add_request([3] * 20, SamplingParams(n=3, temperature=1, max_tokens=30,
                                                         ignore_eos=True, seed=1))
    keep = engine.add_request([11, 12, 13], SamplingParams(temperature=0, max_tokens=20,
                                                           ignore_eos=True))
    for _ in range(3):
        engine.step()
    engine.abort(victim)
    assert all(s.request_id != victim for s in engine.scheduler.running)
    live = list(engine.scheduler.running)
    engine.block_manager.check_invariants(live)
    with pytest.raises(ValueError, match="no request with id"):
        engine.abort(victim)
    result = None
    while engine.has_unfinished():
        for out in engine.step():
            result = out if out.request_id == keep else result
    assert result.token_ids == expected.token_ids
    assert llm.stats()["blocks_used"] == 0


def test_closing_a_stream_aborts_its_request(llm):
    stream = llm.stream("hello", SamplingParams(temperature=0, max_tokens=40, ignore_eos=True))
    next(stream)
    stream.close()
    # the abort is queued before the stats call, so the loop has applied it by then
    assert llm.stats()["blocks_used"] == 0
    assert llm.metrics().running == llm.metrics().waiting == 0
