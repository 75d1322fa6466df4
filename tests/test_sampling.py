import numpy as np
import pytest

from tinypaged.kernels.cpu.sampling import sample_rows
from tinypaged.kernels.reference import sample_filtered
from tinypaged.sampling import SamplingParams, sample, sample_tokens


@pytest.mark.parametrize("kwargs, message", [
    ({"top_p": 1.5}, r"top_p=1.5 must be in \(0, 1\]"),
    ({"top_p": 0.0}, "top_p=0.0"),
    ({"temperature": -0.1}, "temperature=-0.1 must be >= 0"),
    ({"temperature": float("nan")}, "temperature=nan"),
    ({"top_k": -2}, "top_k=-2"),
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


def _random_weights(rng, n_vocab):
    """exp(logits / T - max) rows of several shapes: peaked, flat, tied, underflowing."""
    kind = rng.integers(4)
    if kind == 0:  # an LLM-like spread of logits
        logits = rng.standard_normal(n_vocab) * rng.uniform(1, 6)
    elif kind == 1:  # nearly flat: the nucleus holds most of the vocabulary
        logits = rng.standard_normal(n_vocab) * 0.05
    elif kind == 2:  # few distinct values: ties everywhere
        logits = rng.integers(0, 4, n_vocab).astype(np.float64)
    else:  # one dominant token and an underflowing tail
        logits = rng.standard_normal(n_vocab) * 40
    scaled = (logits / rng.uniform(0.2, 2.0)).astype(np.float32)
    return np.exp(scaled - scaled.max())


@pytest.mark.parametrize("n_vocab, rows", [(7, 300), (1000, 300), (49152, 12)])
def test_the_sampling_kernel_equals_the_reference_bit_for_bit(n_vocab, rows):
    rng = np.random.default_rng(n_vocab)
    weights = np.stack([_random_weights(rng, n_vocab) for _ in range(rows)])
    top_k = rng.choice([0, 1, 2, 5, 40, n_vocab - 1, n_vocab], rows).astype(np.int64)
    top_p = rng.choice([1.0, 0.9, 0.5, 0.999, 1e-6], rows)
    min_p = rng.choice([0.0, 0.0, 0.05, 0.3], rows).astype(np.float32)
    u = rng.random(rows)
    expected = [sample_filtered(weights[r], top_k[r], top_p[r], min_p[r], u[r]) for r in range(rows)]
    for work_items in (1, 2, 5):  # rows dealt to threads: the same draws
        out = np.empty(rows, dtype=np.int64)
        sample_rows(weights, top_k, top_p, min_p, u, out, work_items)
        assert out.tolist() == expected


def test_a_row_samples_the_same_alone_or_in_a_batch():
    rng = np.random.default_rng(5)
    logits = rng.standard_normal((6, 500)).astype(np.float32) * 3
    params = [SamplingParams(temperature=0.8, top_p=0.9, seed=1), SamplingParams(temperature=0),
              SamplingParams(temperature=1.3, top_k=20, seed=2), SamplingParams(min_p=0.1, seed=3),
              SamplingParams(temperature=0.7, repetition_penalty=1.3, logit_bias={3: 5.0}, seed=4),
              SamplingParams(temperature=0.5, presence_penalty=1.0, seed=5)]
    history = [([1, 2, 3, 3], 2)] * 6
    for _ in range(5):
        uniforms = list(rng.random(6))
        batched = sample_tokens(logits, params, uniforms, history)
        alone = [sample_tokens(logits[r:r + 1], [params[r]], uniforms[r:r + 1], history[r:r + 1])[0]
                 for r in range(6)]
        assert batched == alone
        logits = rng.standard_normal((6, 500)).astype(np.float32) * 3


def test_non_finite_logits_are_a_clear_error():
    logits = np.zeros((1, 10), np.float32)
    logits[0, 3] = np.nan
    with pytest.raises(ValueError, match="NaN or infinity"):
        sample_tokens(logits, [SamplingParams()], [0.5])


def test_a_draw_from_candidates_is_the_draw_from_the_whole_row_and_a_tie_asks_for_it():
    from tinypaged.batch.step_logits import HostLogits
    from tinypaged.engine.step_logits import draw_from_candidates, draw_tokens

    rng = np.random.default_rng(5)
    logits = rng.standard_normal((3, 300)).astype(np.float32)
    logits[2, [10, 20, 30]] = 4.0  # the 2nd to 4th most likely tie (top_k=2 cuts them)
    logits[2, 5] = 5.0
    params = SamplingParams(temperature=0.8, top_k=6, top_p=0.95, min_p=0.01)
    for u in np.linspace(0.01, 0.99, 23):
        for r in (0, 1):
            order = np.lexsort((np.arange(300), -logits[r]))[:7]
            want = sample_tokens(logits[r:r + 1], [params], [u])[0]
            assert draw_from_candidates(logits[r, order], order, params, u) == want
    tie = SamplingParams(temperature=0.8, top_k=2)
    order = np.lexsort((np.arange(300), -logits[2]))[:3]
    assert draw_from_candidates(logits[2, order], order, tie, 0.5) is None

    class Candidates(HostLogits):  # what a device hands over: candidates for every row
        fetched = []

        def candidates(self, row):
            order = np.lexsort((np.arange(300), -self.logits[row]))[:3]
            return self.logits[row, order], order

        def rows(self, rows):
            self.fetched += rows
            return super().rows(rows)
    step = Candidates(logits)
    got = draw_tokens(step, [0, 2], [tie, tie], [0.3, 0.4], [((), 0), ((), 0)])
    assert got == sample_tokens(logits[[0, 2]], [tie, tie], [0.3, 0.4])
    assert step.fetched == [2]  # only the tied row came whole
