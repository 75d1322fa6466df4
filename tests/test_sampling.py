import numpy as np
import pytest

from tinypaged.sampling import SamplingParams, sample


@pytest.mark.parametrize("kwargs, message", [
    ({"top_p": 1.5}, r"top_p=1.5 must be in \(0, 1\]"),
    ({"top_p": 0.0}, "top_p=0.0"),
    ({"temperature": -0.1}, "temperature=-0.1 must be >= 0"),
    ({"temperature": float("nan")}, "temperature=nan"),
    ({"top_k": -1}, "top_k=-1"),
    ({"max_tokens": 0}, "max_tokens=0"),
    ({"seed": -3}, "seed=-3"),
])
def test_invalid_values_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs)


def test_unknown_keyword_is_an_error():
    with pytest.raises(TypeError):
        SamplingParams(temprature=0.5)


def test_greedy_and_degenerate_filters_pick_the_argmax():
    rng = np.random.default_rng(0)
    for _ in range(20):
        logits = rng.standard_normal(100).astype(np.float32)
        best = int(np.argmax(logits))
        assert sample(logits, SamplingParams(temperature=0), rng) == best
        assert sample(logits, SamplingParams(temperature=2.0, top_k=1), rng) == best
        assert sample(logits, SamplingParams(temperature=2.0, top_p=1e-6), rng) == best


def _frequencies(logits, params, n=20000, seed=1):
    rng = np.random.default_rng(seed)
    counts = np.bincount([sample(logits, params, rng) for _ in range(n)], minlength=len(logits))
    return counts / n


def test_samples_follow_the_tempered_softmax():
    logits = np.array([2.0, 1.0, 0.5, 0.0, -1.0], np.float32)
    for temperature in (0.5, 1.0, 2.0):
        p = np.exp(logits / temperature)
        p /= p.sum()
        freq = _frequencies(logits, SamplingParams(temperature=temperature))
        np.testing.assert_allclose(freq, p, atol=0.015)  # ~4 standard errors at n=20000


def test_top_k_and_top_p_keep_exactly_the_intended_tokens():
    logits = np.log(np.array([0.4, 0.3, 0.2, 0.06, 0.04]))
    freq = _frequencies(logits, SamplingParams(top_k=2))
    np.testing.assert_allclose(freq, [4 / 7, 3 / 7, 0, 0, 0], atol=0.015)
    # top_p=0.75: 0.4 + 0.3 < 0.75, so the smallest set reaching it also needs 0.2
    freq = _frequencies(logits, SamplingParams(top_p=0.75))
    np.testing.assert_allclose(freq, [4 / 9, 3 / 9, 2 / 9, 0, 0], atol=0.015)


def test_the_same_seed_gives_the_same_draws():
    logits = np.random.default_rng(3).standard_normal(1000)
    draws = [[sample(logits, SamplingParams(), np.random.default_rng(42)) for _ in range(5)]
             for _ in range(2)]
    assert draws[0] == draws[1]
