"""Speculative decoding (speculative_config "ngram"), held against the engine without it:
greedy text bit for bit the same, every block back in the pool, no rejected token in
the prefix cache, bad configs refused by name; and how many proposals pay.

The engine tests fix the number of proposals (always_propose): the draft sizer
follows measured step times, which a busy machine would move."""
import numpy as np
import pytest

from tinypaged import LLM, SamplingParams
from tinypaged.engine.block_manager import blocks_for
from tinypaged.engine.draft_sizer import Acceptance, DraftSizer
from tinypaged.engine.ngram_proposer import NgramIndex
from tinypaged.speculative_config import SpeculativeConfig


@pytest.fixture
def always_propose(monkeypatch):
    """Every speculating sequence takes num_speculative_tokens proposals a step."""
    monkeypatch.setattr(DraftSizer, "choose", lambda self, rates, plain: [self.sizes[-1]] * len(rates))

STORIES = [  # stories260K repeats itself on these, so proposals are accepted and rejected
    "Once upon a time, there was a little girl named Lily. She liked to play. Once upon a "
    "time, there was a little",
    "Tom and Sue went to the park. Tom and Sue",
    "One day, a big dog",
    "The cat sat on the mat. The cat sat on the",
]


def ngram(k=4, low=2, high=4):
    return {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_min": low,
            "prompt_lookup_max": high}


def token_ids(outputs):
    return [o.outputs[0].token_ids for o in outputs]


@pytest.mark.parametrize("config, error, match", [
    ({"method": "ngram"}, ValueError, "needs 'num_speculative_tokens'"),
    ({"num_speculative_tokens": 3}, ValueError, "needs 'method'"),
    ({"method": "ngram", "num_speculative_tokens": 3, "lookahead": 2}, ValueError,
     r"unknown keys \['lookahead'\]"),
    ({"method": "ngram", "num_speculative_tokens": -1}, ValueError,
     "num_speculative_tokens=-1 must be"),
    ({"method": "ngram", "num_speculative_tokens": 1000}, ValueError,
     "num_speculative_tokens=1000 must be"),
    ({"method": "ngram", "num_speculative_tokens": 2.5}, TypeError, "must be an integer"),
    ({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 5,
      "prompt_lookup_max": 3}, ValueError, "prompt_lookup_max=3 must be"),
    ({"method": "eagle", "num_speculative_tokens": 3}, ValueError, "'eagle' is not one of"),
    ({"method": "draft_model", "num_speculative_tokens": 3}, ValueError, "needs 'model'"),
    ({"method": "draft_model", "model": "/no/such/draft", "num_speculative_tokens": 3},
     FileNotFoundError, "/no/such/draft"),
    ({"method": "draft_model", "model": "x", "num_speculative_tokens": 3, "prompt_lookup_max": 3},
     ValueError, "are for method 'ngram'"),
    ({"method": "ngram", "model": "x", "num_speculative_tokens": 3}, ValueError,
     "is for method 'draft_model'"),
    ("{not json", ValueError, "not valid JSON"),
    ([4], TypeError, "must be a dict"),
])
def test_a_bad_speculative_config_is_refused_by_name(stories_dir, config, error, match):
    with pytest.raises(error, match=match):
        LLM(stories_dir, speculative_config=config)


def test_lookup_sizes_default_and_follow_each_other():
    assert (SpeculativeConfig.of(ngram(low=None, high=None)).prompt_lookup_min,
            SpeculativeConfig.of(ngram(low=None, high=None)).prompt_lookup_max) == (2, 4)
    one = SpeculativeConfig.of('{"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 3}')
    assert (one.prompt_lookup_min, one.prompt_lookup_max) == (3, 3)


def rescan(tokens, k, low, high):
    """The proposal by brute force: the longest suffix (high down to low tokens) that
    occurred before, at its latest occurrence; the k tokens after it."""
    length = len(tokens)
    for n in range(min(high, length - 1), low - 1, -1):
        suffix = tokens[length - n:]
        for end in range(length - 1, n - 1, -1):
            if tokens[end - n:end] == suffix:
                return tokens[end:end + k]
    return []


def test_the_ngram_index_proposes_what_a_rescan_finds():
    """Grown a token at a time (and several at once), the index proposes exactly what a
    rescan of the whole sequence does, on sequences with many repeats."""
    rng = np.random.default_rng(0)
    for trial in range(40):
        low, high, k = int(rng.integers(1, 3)), int(rng.integers(3, 6)), int(rng.integers(1, 6))
        tokens = [int(t) for t in rng.integers(0, 4, 120)]
        index, length = NgramIndex(low, high), 1
        while length < len(tokens):
            length += int(rng.integers(1, 4))
            seen = tokens[:length]
            assert index.propose(seen, k) == rescan(seen, k, low, high), (trial, length)


def test_greedy_speculation_gives_plain_greedy_tokens_bit_for_bit(stories_dir, always_propose):
    """Batches of greedy requests (prompts that repeat themselves and one that does not)
    with a seeded sampled request among them: the same tokens as the engine without
    speculation, for several k and with prefix caching on and off, in fewer steps."""
    params = [SamplingParams(temperature=0, max_tokens=60, ignore_eos=True)] * len(STORIES)
    params = params + [SamplingParams(temperature=0.8, seed=3, max_tokens=30, ignore_eos=True)]
    prompts = STORIES + ["Once upon a time"]
    plain_llm = LLM(stories_dir)
    plain = token_ids(plain_llm.generate(prompts, params))
    for k, caching in ((1, True), (3, False), (6, True)):
        llm = LLM(stories_dir, enable_prefix_caching=caching, speculative_config=ngram(k))
        assert token_ids(llm.generate(prompts, params)) == plain, (k, caching)
        stats = llm.stats()
        assert 0 < stats["spec_num_accepted_tokens"] < stats["spec_num_draft_tokens"], stats
        assert stats["steps"] < plain_llm.stats()["steps"] and stats["blocks_used"] == 0
        assert 1 < stats["spec_mean_accepted_length"] <= k + 1


def test_stops_and_lengths_cut_acceptance_where_they_fire(stories_dir, always_propose):
    """EOS (not ignored), stop strings and max_tokens end a request inside a run of
    accepted proposals exactly where plain decoding ends it."""
    params = [SamplingParams(temperature=0, max_tokens=n) for n in (7, 40, 61)] + \
        [SamplingParams(temperature=0, max_tokens=80, stop=["little"]),
         SamplingParams(temperature=0, max_tokens=80, stop=[" the"], include_stop_str_in_output=True)]
    prompts = [STORIES[0], STORIES[1], STORIES[3], STORIES[0], STORIES[3]]
    want = LLM(stories_dir).generate(prompts, params)
    got = LLM(stories_dir, speculative_config=ngram(5)).generate(prompts, params)
    assert [(o.outputs[0].token_ids, o.outputs[0].text, o.outputs[0].finish_reason) for o in got] == \
        [(o.outputs[0].token_ids, o.outputs[0].text, o.outputs[0].finish_reason) for o in want]


def test_rollback_keeps_the_pool_exact_step_by_step(stories_dir, always_propose):
    """After every step: the pool's invariants hold, a sequence holds no block past the
    one its next token needs, it has no proposal left, and each of its cached blocks is
    keyed by the tokens it holds (never a rejected proposal's); at the end every block
    is free."""
    llm = LLM(stories_dir, block_size=4, num_blocks=200, speculative_config=ngram(6))
    engine = llm.engine
    for i, prompt in enumerate(STORIES * 2):
        engine.add_request(prompt, SamplingParams(temperature=0, max_tokens=30 + 7 * i, ignore_eos=True))
    while engine.has_unfinished():
        engine.step()
        live = engine.scheduler.running
        engine.block_manager.check_invariants(live)
        for seq in live:
            assert seq.num_drafts == 0 and len(seq.block_table) <= blocks_for(len(seq), 4)
            assert seq.num_computed_tokens == len(seq) - 1
            for i, block_id in enumerate(seq.block_table):
                block = engine.block_manager.blocks[block_id]
                if block.hash is not None:
                    assert block.token_ids == tuple(seq.token_ids[4 * i:4 * i + 4])
    assert engine.speculation.num_accepted_tokens > 0
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


def test_under_pool_pressure_preemption_and_speculation_give_the_same_tokens(stories_dir, always_propose):
    prompts = STORIES * 4
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    want = token_ids(LLM(stories_dir, block_size=4).generate(prompts, params))
    tight = LLM(stories_dir, block_size=4, num_blocks=40, speculative_config=ngram(4))
    assert token_ids(tight.generate(prompts, params)) == want
    stats = tight.stats()
    assert stats["preemptions"] > 0 and stats["blocks_used"] == 0 and stats["spec_num_accepted_tokens"] > 0


def test_the_prefix_cache_holds_no_rejected_token(stories_dir, always_propose):
    """Each first run's prompt and output come back as a prompt: the blocks the runs
    cached (with prefix caching on, their K/V are read, not recomputed) give the same
    continuations as an engine that never speculated."""
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    spec, plain = LLM(stories_dir, block_size=4, speculative_config=ngram(6)), LLM(stories_dir, block_size=4)
    first = spec.generate(STORIES, params)
    again = [list(o.prompt_token_ids) + list(o.outputs[0].token_ids) for o in first]
    cached_before = spec.stats()["prefix_cache_hit_tokens"]
    assert token_ids(spec.generate(again, params)) == token_ids(plain.generate(again, params))
    assert spec.stats()["prefix_cache_hit_tokens"] - cached_before > sum(map(len, again)) // 2


def test_the_default_model_speculates_bit_for_bit(smollm2_gguf, always_propose):
    """SmolLM2's Q4_1 GGUF (packed products over k + 1 rows): a copy task and free text
    give plain greedy decoding's tokens."""
    code = "def area(width, height):\n    return width * height\n\nprint(area(3, 4))\n"
    prompts = [[{"role": "user", "content": "Rename area to surface in this code:\n\n" + code}],
               [{"role": "user", "content": "Write a haiku about the sea."}]]
    params = SamplingParams(temperature=0, max_tokens=48)
    want = token_ids(LLM(smollm2_gguf, kv_cache_memory=64 << 20).chat(prompts, params))
    llm = LLM(smollm2_gguf, kv_cache_memory=64 << 20, speculative_config=ngram(4))
    assert token_ids(llm.chat(prompts, params)) == want
    assert llm.stats()["spec_num_accepted_tokens"] > 0


def test_the_sized_engine_gives_plain_greedy_tokens_whatever_it_measures(stories_dir):
    """With the draft sizer choosing from the step times it measures (whatever they
    are on this machine), the tokens are plain greedy's."""
    params = SamplingParams(temperature=0, max_tokens=50, ignore_eos=True)
    want = token_ids(LLM(stories_dir).generate(STORIES, params))
    llm = LLM(stories_dir, speculative_config=ngram(7))
    for _ in range(2):
        assert token_ids(llm.generate(STORIES, params)) == want


def test_acceptance_falls_with_rejections_and_fades_back_while_idle():
    record = Acceptance()
    assert record.rate == 0.5
    for _ in range(5):
        record.note(4, 0)
    low = record.rate
    assert low < 0.2
    record.note(4, 4)
    assert record.rate > low
    for _ in range(200):
        record.idle()
    assert abs(record.rate - 0.5) < 0.01
    trusted = Acceptance(prior=0.95)  # (a new sequence where the engine's rate is 0.95)
    assert trusted.rate == pytest.approx(0.95)
    for _ in range(200):
        trusted.idle()
    assert trusted.rate == pytest.approx(0.95)


def test_a_new_sequence_starts_from_the_engines_acceptance_so_far(stories_dir):
    """A draft that agrees with the target (stories260K drafting for itself): the second
    request's first proposals are sized by the first request's record, not by an even
    prior that a draft costing more than half a step never gets past."""
    llm = LLM(stories_dir, speculative_config=draft(stories_dir))
    speculation = llm.engine.speculation
    assert speculation.overall.rate == 0.5
    params = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
    llm.generate([STORIES[0]], params)
    first = speculation.overall.rate
    assert first > 0.8, speculation.as_dict()  # (every proposal accepted; the prior still weighs)
    seen = []
    real_choose = speculation.sizer.choose
    speculation.sizer.choose = lambda rates, plain: seen.append(rates) or real_choose(rates, plain)
    llm.generate([STORIES[1]], params)
    assert next(rates for rates in seen if rates) == [pytest.approx(first)]  # (its first decode)
    for _ in range(10):  # an engine whose proposals were mostly rejected: a new sequence
        speculation.overall.note(4, 0)  # starts even, so that its idle fade leads it back
    seen.clear()  # to trying (from a lower prior it would never try again)
    llm.generate([STORIES[2]], params)
    assert next(rates for rates in seen if rates) == [0.5]


def test_the_sizer_takes_the_size_that_gives_most_tokens_a_second():
    sizer = DraftSizer(7)
    assert sizer.sizes == [1, 3, 7]
    assert sizer.choose([0.9], 1) == [0]  # a plain step of this batch size not measured yet
    for rows in range(1, 41):  # memory-bound: a row more costs 4% of a step
        sizer.note_step(rows, 9.0)  # (a size's first step is not kept: compiles)
        sizer.note_step(rows, 1.0 + 0.04 * (rows - 1))
    assert sizer.choose([0.9], 1) == [7]
    assert sizer.choose([0.5], 1) == [3]
    assert sizer.choose([0.02], 1) == [0]  # (2% more tokens for 4% more time)
    assert sizer.choose([0.9, 0.9], 2) == [7, 7]
    compute_bound = DraftSizer(7)  # a row costs what a row gives: proposals never pay
    for rows in range(30, 41):
        compute_bound.note_step(rows, rows / 32)
        compute_bound.note_step(rows, rows / 32)
    assert compute_bound.choose([0.8] * 4, 32) == [0, 0, 0, 0]
    guessing = DraftSizer(3)  # unmeasured sizes are guessed cheap, so they get tried
    guessing.note_step(1, 0.01)
    assert guessing.choose([0.5], 1) == [0]  # (its plain step seen once: not yet measured)
    guessing.note_step(1, 0.01)
    assert guessing.choose([0.5], 1) == [3]


def chi_square_limit(dof: int, z: float = 3.09) -> float:
    """The chi-square statistic's 99.9% quantile for dof degrees of freedom (Wilson and
    Hilferty's approximation)."""
    return dof * (1 - 2 / (9 * dof) + z * (2 / (9 * dof)) ** 0.5) ** 3


def homogeneity(a: list[int], b: list[int]) -> tuple[float, int]:
    """Two samples' chi-square statistic (tokens seen 10 times or more) and its dof."""
    from collections import Counter
    ca, cb = Counter(a), Counter(b)
    keys = [k for k in set(ca) | set(cb) if ca[k] + cb[k] >= 10]
    return sum((ca[k] - cb[k]) ** 2 / (ca[k] + cb[k]) for k in keys), max(1, len(keys) - 1)


def test_sampling_with_speculation_draws_what_plain_sampling_draws(stories_dir, always_propose,
                                                                  monkeypatch):
    """Proposals fixed to three likely tokens (accepted about a third of the time): 300
    seeded samples (top_k 4) are plain sampling's, seed for seed, so their token
    distribution at every position passes a chi-square test against it. The same test
    fails for a broken rule that emits the first proposal whatever the target drew."""
    from tinypaged.engine.ngram_proposer import NgramProposer
    from tinypaged.engine.speculation import Speculation
    monkeypatch.setattr(NgramProposer, "propose", lambda self, seq, limit: [276, 261, 377][:limit])
    prompt, n = STORIES[1], 300
    params = [SamplingParams(temperature=1.0, top_k=4, seed=s, max_tokens=4, ignore_eos=True)
              for s in range(n)]
    plain = token_ids(LLM(stories_dir).generate([prompt] * n, params))
    llm = LLM(stories_dir, speculative_config=ngram(3))
    assert token_ids(llm.generate([prompt] * n, params)) == plain
    assert 0.1 < llm.stats()["spec_acceptance_rate"] < 0.9
    for position in (1, 2, 3):
        statistic, dof = homogeneity([t[position] for t in plain],
                                     [t[position] for t in token_ids(llm.generate([prompt] * n, params))])
        assert statistic <= chi_square_limit(dof), position
    right = Speculation.accept
    monkeypatch.setattr(Speculation, "accept",
                        lambda self, drafts, targets: max(right(self, drafts, targets), min(1, len(drafts))))
    broken = token_ids(llm.generate([prompt] * n, params))
    assert any(homogeneity([t[p] for t in plain], [t[p] for t in broken])[0]
               > chi_square_limit(homogeneity([t[p] for t in plain], [t[p] for t in broken])[1])
               for p in (1, 2, 3))


def test_seeded_sampling_with_logprobs_is_plain_samplings(stories_dir, always_propose):
    """top_p, min_p and logprobs: each seeded sample's tokens and logprobs are plain
    sampling's; the same seed twice gives the same sample."""
    params = [SamplingParams(temperature=0.9, top_p=0.9, seed=7, max_tokens=40, ignore_eos=True, logprobs=2),
              SamplingParams(temperature=1.2, min_p=0.05, seed=8, max_tokens=40, ignore_eos=True)]
    prompts = [STORIES[0], STORIES[3]]
    want = LLM(stories_dir).generate(prompts, params)
    llm = LLM(stories_dir, speculative_config=ngram(4))
    for _ in range(2):
        got = llm.generate(prompts, params)
        assert token_ids(got) == token_ids(want)
        assert got[0].outputs[0].token_logprobs == want[0].outputs[0].token_logprobs
    assert llm.stats()["spec_num_accepted_tokens"] > 0


def test_proposals_stop_at_the_context(stories_dir, always_propose):
    """A request that runs into max_model_len: no proposal takes a position past it (the
    RoPE tables end there), and it ends where plain decoding ends it, at the context."""
    prompt = STORIES[0]
    params = SamplingParams(temperature=0, ignore_eos=True)
    want = LLM(stories_dir, max_model_len=60).generate(prompt, params)[0].outputs[0]
    llm = LLM(stories_dir, max_model_len=60, speculative_config=ngram(8))
    got = llm.generate(prompt, params)[0].outputs[0]
    assert got.token_ids == want.token_ids and got.finish_reason == want.finish_reason == "length"
    assert llm.stats()["spec_num_accepted_tokens"] > 0 and llm.stats()["blocks_used"] == 0


def test_gemma3_speculates_past_its_sliding_window_bit_for_bit(gemma3_gguf, always_propose):
    """Gemma 3 270M: its layers in several KV groups (sliding layers of 512 keys, global
    ones); a context past the window, whose sliding groups' blocks behind it go back to
    the pool while proposals come and go: plain greedy's tokens, every block back at
    the end."""
    prompt = "The keeper climbed the stairs and lit the lamp. " * 60  # ~660 tokens
    params = SamplingParams(temperature=0, max_tokens=48, ignore_eos=True)
    want = token_ids(LLM(gemma3_gguf, kv_cache_memory=64 << 20).generate([prompt], params))
    llm = LLM(gemma3_gguf, kv_cache_memory=64 << 20, speculative_config=ngram(5))
    assert llm.engine.block_manager.num_groups > 1
    assert token_ids(llm.generate([prompt], params)) == want
    stats = llm.stats()
    assert stats["spec_num_accepted_tokens"] > 0 and stats["blocks_used"] == 0


def test_penalties_bad_words_and_min_tokens_see_the_tokens_before_each_row(stories_dir, always_propose):
    """Options whose rows depend on the output so far: each proposal's row is penalised
    and masked by the tokens up to it, so greedy and seeded samples are plain decoding's."""
    params = [SamplingParams(temperature=0, max_tokens=50, ignore_eos=True, repetition_penalty=1.3),
              SamplingParams(temperature=0, max_tokens=50, ignore_eos=True, presence_penalty=0.8,
                             frequency_penalty=0.4),
              SamplingParams(temperature=0, max_tokens=50, ignore_eos=True, bad_words=["park", "Sue"]),
              SamplingParams(temperature=0, max_tokens=50, min_tokens=30),
              SamplingParams(temperature=0.8, seed=5, max_tokens=50, ignore_eos=True, frequency_penalty=0.5)]
    prompts = [STORIES[0], STORIES[1], STORIES[1], STORIES[3], STORIES[0]]
    want = LLM(stories_dir).generate(prompts, params)
    llm = LLM(stories_dir, speculative_config=ngram(4))
    got = llm.generate(prompts, params)
    assert token_ids(got) == token_ids(want)
    assert [o.outputs[0].finish_reason for o in got] == [o.outputs[0].finish_reason for o in want]
    assert llm.stats()["spec_num_accepted_tokens"] > 0


def test_grammar_constrained_requests_speculate_with_each_rows_grammar(stories_dir, always_propose):
    """A regex and a JSON schema: each proposal's row is masked by the grammar past the
    proposals before it, proposals stop where the grammar refuses one, and the output
    is plain decoding's (greedy and seeded), valid, ending where the grammar does."""
    import json as json_module
    from tinypaged.structured import StructuredOutputs
    schema = {"type": "object", "additionalProperties": False, "required": ["who", "where"],
              "properties": {"who": {"type": "string", "maxLength": 30},
                             "where": {"type": "string", "maxLength": 30}}}
    params = [SamplingParams(temperature=0, max_tokens=60,
                             structured_outputs=StructuredOutputs(regex="(Tom and Sue went to the park\\. ){3}")),
              SamplingParams(temperature=0, max_tokens=80, structured_outputs=StructuredOutputs(json=schema)),
              SamplingParams(temperature=0.7, seed=2, max_tokens=80,
                             structured_outputs=StructuredOutputs(json=schema))]
    prompts = [STORIES[1], STORIES[1] + ' {"who": "Tom and Sue", "where": "the park"} ', STORIES[1]]
    want = LLM(stories_dir).generate(prompts, params)
    llm = LLM(stories_dir, speculative_config=ngram(4))
    got = llm.generate(prompts, params)
    assert token_ids(got) == token_ids(want)
    assert got[0].outputs[0].text == "Tom and Sue went to the park. " * 3
    for out in got[1:]:
        assert set(json_module.loads(out.outputs[0].text)) == {"who", "where"}
    assert llm.stats()["spec_num_accepted_tokens"] > 0


def test_the_samples_of_a_request_each_speculate(stories_dir, always_propose):
    """n > 1: each sample proposes from its own tokens, the blocks it shares with its
    siblings copied on write for a proposal's slot; with room and under pressure (a
    preemption), the samples are plain decoding's."""
    prompts = [STORIES[1], STORIES[0]]
    params = [SamplingParams(n=3, temperature=0.8, seed=4, max_tokens=40, ignore_eos=True),
              SamplingParams(n=2, temperature=0, max_tokens=40, ignore_eos=True)]
    want = [[c.token_ids for c in o.outputs] for o in LLM(stories_dir).generate(prompts, params)]
    for block_size, num_blocks in ((16, None), (4, 60)):
        llm = LLM(stories_dir, block_size=block_size, num_blocks=num_blocks, speculative_config=ngram(4))
        got = [[c.token_ids for c in o.outputs] for o in llm.generate(prompts, params)]
        assert got == want, block_size
        stats = llm.stats()
        assert stats["spec_num_accepted_tokens"] > 0 and stats["blocks_used"] == 0


def draft(path, k=4):
    return {"method": "draft_model", "model": str(path), "num_speculative_tokens": k}


def test_a_draft_model_proposes_and_the_target_decides_bit_for_bit(stories_dir, always_propose):
    """stories260K drafting for itself (nearly every proposal accepted) and for its own
    Q8_0 quantization (fewer): plain decoding's tokens, greedy and seeded, the draft's
    own pool holding only what its sequences kept."""
    params = [SamplingParams(temperature=0, max_tokens=40, ignore_eos=True),
              SamplingParams(temperature=0.8, seed=1, max_tokens=40, ignore_eos=True),
              SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)]
    prompts = [STORIES[0], STORIES[1], STORIES[2]]
    for options in ({}, {"quantization": "q8_0"}):
        want = token_ids(LLM(stories_dir, **options).generate(prompts, params))
        llm = LLM(stories_dir, speculative_config=draft(stories_dir), **options)
        assert token_ids(llm.generate(prompts, params)) == want, options
        stats = llm.stats()
        rate = stats["spec_acceptance_rate"]
        assert (rate > 0.7) if not options else (0.3 < rate), (options, stats)  # (the seeded sample: p(argmax))
        proposer = llm.engine.speculation.proposer
        for seq, slots in proposer.slots.items():
            assert slots.num_computed_tokens <= len(seq) - 1
        proposer.block_manager.check_invariants(list(proposer.slots.values()))


def test_a_draft_with_another_tokenizer_is_refused_by_name(stories_dir, tiny_model_dir):
    with pytest.raises(ValueError, match="tokenizer has .* tokens, the target's .*: a draft must share"):
        LLM(stories_dir, speculative_config=draft(tiny_model_dir))


def test_the_draft_is_loaded_on_a_thread_of_its_own_as_the_target_is(stories_dir, monkeypatch):
    """Loading runs parallel kernels: run in the caller's thread, they leave a second
    OpenMP team, and every later step beside it ran ~1.7x slower (draft and target
    alike; bench/NOTES.md). Both models are read on the loading thread."""
    import threading

    from tinypaged.engine import model_loading

    readers = []
    real_load = model_loading.load_model

    def load_model(*args, **kwargs):
        readers.append(threading.current_thread().name)
        return real_load(*args, **kwargs)
    monkeypatch.setattr(model_loading, "load_model", load_model)
    LLM(stories_dir, speculative_config=draft(stories_dir)).close()
    assert readers == ["tinypaged-load", "tinypaged-load"]
