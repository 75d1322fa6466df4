"""Beam search over shared blocks: greedy at width 1, exhaustive search when the
width keeps every candidate, and shared blocks never written in place."""
import itertools

import numpy as np
import pytest

from helpers import dense_greedy, write_tiny_model
from tinypaged import LLM
from tinypaged.engine.beam_search import BeamSearch
from tinypaged.kernels.reference import log_softmax
from tinypaged.model.reference import ReferenceModel
from tinypaged.model.loading import load_model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("beam") / "tiny"
    write_tiny_model(str(path), seed=6, max_position_embeddings=128)
    return path


@pytest.fixture(scope="module")
def six_token_model(tmp_path_factory):
    """A model whose vocabulary has 6 tokens: exhaustive search is 6^3 sequences."""
    path = tmp_path_factory.mktemp("beam6") / "tiny"
    write_tiny_model(str(path), seed=8, vocab_size=6, eos_token_id=5)
    return path


def test_width_1_is_greedy(tiny):
    llm = LLM(tiny, block_size=4, num_blocks=100)
    oracle = ReferenceModel(*load_model(tiny))
    for prompt in ([3, 4, 5], list(range(10, 31))):
        beams = llm.beam_search(prompt, beam_width=1, max_tokens=10, ignore_eos=True)[0].beams
        assert len(beams) == 1
        assert beams[0].token_ids == dense_greedy(oracle, prompt, 10)
    assert llm.stats()["blocks_used"] == 0


def test_a_width_that_keeps_every_candidate_equals_exhaustive_search(six_token_model):
    llm = LLM(six_token_model, block_size=2, num_blocks=200)
    oracle = ReferenceModel(*load_model(six_token_model))
    prompt = [1, 3, 0]

    def cum_logprob(continuation):
        logits = oracle.forward(prompt + list(continuation), oracle.new_cache())
        logp = log_softmax(logits.astype(np.float64))[len(prompt) - 1:-1]
        return float(sum(logp[i, t] for i, t in enumerate(continuation)))
    exhaustive = max(itertools.product(range(6), repeat=3), key=cum_logprob)
    result = llm.beam_search(prompt, beam_width=36, max_tokens=3, ignore_eos=True)[0]
    best = result.beams[0]
    assert tuple(best.token_ids) == exhaustive
    assert best.cum_logprob == pytest.approx(cum_logprob(exhaustive), abs=1e-4)
    assert len(result.beams) == 36
    assert llm.stats()["blocks_used"] == 0


def test_shared_blocks_are_never_written_in_place(tiny):
    llm = LLM(tiny, block_size=4, num_blocks=200)
    engine = llm.engine
    run = engine.runner.forward
    checks = []

    def checked_run(batch):
        for seq in batch.decodes:  # the block each beam writes this step is its own
            block = seq.block_table[(len(seq) - 1) // 4]
            assert engine.block_manager.blocks[block].ref_count == 1
        checks.append(len(batch.decodes))
        return run(batch)
    engine.runner.forward = checked_run
    search = BeamSearch(engine, list(range(3, 30)), beam_width=4, max_tokens=12,
                        length_penalty=1.0, ignore_eos=True)
    shared_seen = False
    while not search.done:
        search.step()
        live = [seq for seq, _ in search.live]
        engine.block_manager.check_invariants(live)
        shared_seen |= any(engine.block_manager.blocks[b].ref_count > 1
                           for seq in live for b in seq.block_table)
    assert shared_seen and sum(checks) > 12  # beams did share blocks, and decoded
    assert search.peak_blocks < search.peak_unshared
    assert len(search.best()) == 4
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


def test_eos_ends_beams_and_bad_arguments(tiny):
    llm = LLM(tiny, block_size=4, num_blocks=100)
    out = llm.beam_search("hello", beam_width=3, max_tokens=40)[0]
    assert len(out.beams) == 3
    assert all(b.finish_reason in ("stop", "length") for b in out.beams)
    assert out.beams == sorted(out.beams, key=lambda b: -b.score)
    with pytest.raises(ValueError, match="beam_width=0"):
        llm.beam_search("hello", beam_width=0)
    with pytest.raises(ValueError, match="prompt is empty"):
        llm.beam_search("", beam_width=2)
