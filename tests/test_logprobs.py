"""What a server needs from sampling: logprobs and prompt logprobs equal to the dense
reference's log-softmax, OpenAI's penalties and logit bias, seeds that hold in any
batch, and perplexity through the engine agreeing with the dense oracle."""
import threading

import numpy as np
import pytest

from helpers import write_tiny_model
from tinypaged import LLM, SamplingParams
from tinypaged.kernels.reference import log_softmax
from tinypaged.model.reference import ReferenceModel
from tinypaged.model.loading import load_model
from tinypaged.perplexity import engine_nll, reference_nll
from tinypaged.sampling import adjust_logits

V = 262  # the tiny model's vocabulary


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("logprobs") / "tiny"
    write_tiny_model(str(path), seed=5, max_position_embeddings=256)
    return path


@pytest.fixture(scope="module")
def oracle(tiny):
    return ReferenceModel(*load_model(tiny))


def reference_logprobs(oracle, token_ids) -> np.ndarray:
    """log p(. | token_ids[:i + 1]) for every i: (T, V), float64."""
    logits = oracle.forward(token_ids, oracle.new_cache(len(token_ids)))
    return log_softmax(logits.astype(np.float64))


def assert_entry_matches(entry, expected_row, token, k):
    assert entry.token_id == token
    assert entry.logprob == pytest.approx(expected_row[token], abs=1e-4)
    top = np.argsort(-expected_row)[:k]
    assert [t for t, _ in entry.top] == list(top)
    np.testing.assert_allclose([lp for _, lp in entry.top], expected_row[top], atol=1e-4)


def test_generated_token_logprobs_equal_the_dense_reference(tiny, oracle):
    llm = LLM(tiny, block_size=4, num_blocks=200)
    prompts = [[5, 6, 7, 8, 9], list(range(20, 47))]
    outputs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=10, ignore_eos=True,
                                                   logprobs=5))
    for prompt, out in zip(prompts, outputs):
        sample = out.outputs[0]
        full = prompt + sample.token_ids
        expected = reference_logprobs(oracle, full)  # row i predicts token i + 1
        assert len(sample.token_logprobs) == len(sample.token_ids) == 10
        for i, (token, entry) in enumerate(zip(sample.token_ids, sample.token_logprobs)):
            assert_entry_matches(entry, expected[len(prompt) - 1 + i], token, 5)
        assert sample.cumulative_logprob == pytest.approx(sum(e.logprob for e in sample.token_logprobs))
    plain = llm.generate(prompts[:1], SamplingParams(temperature=0, max_tokens=3))[0].outputs[0]
    assert plain.token_logprobs is None and plain.cumulative_logprob is None  # only when asked for


@pytest.mark.parametrize("budget, block_size", [(512, 16), (7, 4), (3, 1)])
def test_prompt_logprobs_equal_the_reference_in_chunks_and_past_the_prefix_cache(
        tiny, oracle, budget, block_size):
    llm = LLM(tiny, block_size=block_size, num_blocks=600, max_num_batched_tokens=budget)
    shared = list(range(30, 50))
    llm.generate([shared + [7, 8]], SamplingParams(max_tokens=2))  # caches the shared prefix
    prompts = [shared + [9, 10, 11], [3, 4], list(range(60, 100))]
    outputs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=2, prompt_logprobs=3))
    for prompt, out in zip(prompts, outputs):
        expected = reference_logprobs(oracle, prompt)
        assert out.prompt_token_logprobs[0] is None and len(out.prompt_token_logprobs) == len(prompt)
        for i in range(1, len(prompt)):
            assert_entry_matches(out.prompt_token_logprobs[i], expected[i - 1], prompt[i], 3)


def test_prompt_logprobs_survive_preemption(tiny, oracle):
    prompts = [list(range(3 + i, 40 + i)) for i in range(6)]
    tight = LLM(tiny, block_size=4, num_blocks=40)  # ~160 slots for 6 x ~57 tokens: preempts
    outputs = tight.generate(prompts, SamplingParams(temperature=0, max_tokens=20, ignore_eos=True,
                                                     prompt_logprobs=0))
    assert tight.stats()["preemptions"] > 0
    for prompt, out in zip(prompts, outputs):
        expected = reference_logprobs(oracle, prompt)
        got = [e.logprob for e in out.prompt_token_logprobs[1:]]
        np.testing.assert_allclose(got, expected[np.arange(len(prompt) - 1), prompt[1:]], atol=1e-4)


def test_presence_and_frequency_penalties_follow_openai(tiny, oracle):
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, presence_penalty=1.5,
                            frequency_penalty=0.7)
    prompt = [11, 12, 13]
    got = LLM(tiny, num_blocks=50).generate([prompt], params)[0].token_ids
    cache = oracle.new_cache(64)
    logits = oracle.forward(prompt, cache)[-1].astype(np.float64)
    expected = []
    for _ in range(12):  # OpenAI: logit - frequency * count - presence * (count > 0), output only
        counts = np.bincount(expected, minlength=V).astype(np.float64)
        token = int(np.argmax(logits - 0.7 * counts - 1.5 * (counts > 0)))
        expected.append(token)
        logits = oracle.forward([token], cache)[-1].astype(np.float64)
    assert got == expected
    plain = LLM(tiny, num_blocks=50).generate([prompt], SamplingParams(temperature=0, max_tokens=12,
                                                                       ignore_eos=True))[0]
    assert len(set(got)) > len(set(plain.token_ids))  # the penalties did push for variety


def test_adjust_logits_on_random_inputs():
    rng = np.random.default_rng(0)
    for _ in range(20):
        logits = rng.standard_normal(50).astype(np.float32)
        tokens = list(rng.integers(0, 50, 30))
        bias = {int(t): float(b) for t, b in zip(rng.integers(0, 50, 4), rng.uniform(-5, 5, 4))}
        p = SamplingParams(presence_penalty=0.5, frequency_penalty=-0.3, logit_bias=bias)
        counts = np.bincount(tokens[10:], minlength=50)
        expected = logits.astype(np.float64) + 0.3 * counts - 0.5 * (counts > 0)
        for t, b in bias.items():
            expected[t] += b
        np.testing.assert_allclose(adjust_logits(logits, p, tokens, 10), expected, rtol=1e-12)


def test_logit_bias_steers_greedy_choices(tiny):
    llm = LLM(tiny, num_blocks=50)
    prompt = [20, 21, 22]
    plain = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=6, ignore_eos=True))[0]
    forced = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=6, ignore_eos=True,
                                                   logit_bias={77: 100}))[0]
    assert forced.token_ids == [77] * 6
    banned = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=6, ignore_eos=True,
                                                   logit_bias={plain.token_ids[0]: -100}))[0]
    assert banned.token_ids[0] != plain.token_ids[0]
    with pytest.raises(ValueError, match="logit_bias: token id 999 is out of range"):
        llm.generate([prompt], SamplingParams(logit_bias={999: 1.0}))


@pytest.mark.parametrize("kwargs, error, message", [
    ({"presence_penalty": 2.5}, ValueError, r"presence_penalty=2.5 must be in \[-2, 2\]"),
    ({"frequency_penalty": "1"}, TypeError, r"frequency_penalty must be a number, got '1' \(str\)"),
    ({"logit_bias": {1: 101}}, ValueError, r"logit_bias\[1\]=101 must be in \[-100, 100\]"),
    ({"logit_bias": {-1: 1}}, ValueError, r"logit_bias token id=-1 must be in \[0, 2147483647\]"),
    ({"logprobs": 21}, ValueError, r"logprobs=21 must be in \[0, 20\]"),
    ({"prompt_logprobs": -1}, ValueError, "prompt_logprobs=-1"),
])
def test_invalid_new_sampling_values_are_named(kwargs, error, message):
    with pytest.raises(error, match=message):
        SamplingParams(**kwargs)


def test_a_seed_reproduces_whatever_else_runs_beside_it(tiny):
    llm = LLM(tiny, block_size=4, num_blocks=400)
    seeded = SamplingParams(temperature=0.9, top_p=0.95, max_tokens=16, seed=1234, ignore_eos=True,
                            presence_penalty=0.4, logprobs=2)
    alone = llm.generate([[40, 41, 42]], seeded)[0].outputs[0]
    noise = SamplingParams(temperature=1.2, max_tokens=24, ignore_eos=True)
    got = []

    def seeded_call():
        got.append(llm.generate([[40, 41, 42]], seeded)[0].outputs[0])
    threads = [threading.Thread(target=seeded_call)] + [
        threading.Thread(target=llm.generate, args=([[i, i + 1] * (i % 7 + 1)], noise))
        for i in range(3, 12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got[0].token_ids == alone.token_ids
    assert got[0].cumulative_logprob == pytest.approx(alone.cumulative_logprob, abs=1e-4)


def test_perplexity_through_the_engine_equals_the_dense_oracle(tiny, oracle):
    ids = list(np.random.default_rng(3).integers(3, V, 600))  # longer than a window: 2 windows
    llm = LLM(tiny, block_size=16, num_blocks=200, max_num_batched_tokens=64)
    got, expected = engine_nll(llm, ids), reference_nll(oracle, ids)
    assert got.shape == expected.shape == (len(ids) - 1,)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)
    assert llm.stats()["blocks_used"] == 0


@pytest.mark.cuda
def test_logprobs_on_the_cuda_backend_equal_the_cpu_backend(tiny):
    params = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True, logprobs=3,
                            prompt_logprobs=2, presence_penalty=0.5, logit_bias={9: 2.0})
    prompt = [5, 6, 7, 8, 9, 10]
    cpu = LLM(tiny, backend="cpu", num_blocks=8).generate([prompt], params)[0]
    gpu = LLM(tiny, backend="cuda", num_blocks=8).generate([prompt], params)[0]
    assert gpu.token_ids == cpu.token_ids
    for a, b in zip(gpu.outputs[0].token_logprobs + gpu.prompt_token_logprobs[1:],
                    cpu.outputs[0].token_logprobs + cpu.prompt_token_logprobs[1:]):
        assert a.token_id == b.token_id and [t for t, _ in a.top] == [t for t, _ in b.top]
        np.testing.assert_allclose([a.logprob] + [lp for _, lp in a.top],
                                   [b.logprob] + [lp for _, lp in b.top], atol=2e-3)
