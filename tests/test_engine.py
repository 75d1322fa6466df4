"""The paged engine on a tiny random model: token-for-token equal to the dense reference,
sharing blocks, batching continuously and surviving memory pressure."""
import numpy as np
import pytest

from helpers import dense_greedy, write_tiny_model
from tinypaged import LLM, SamplingParams
from tinypaged.model.reference import ReferenceModel
from tinypaged.model.loading import load_model

GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("engine") / "tiny"
    write_tiny_model(str(path), seed=4, max_position_embeddings=128)
    return path


@pytest.fixture(scope="module")
def oracle(tiny):
    return ReferenceModel(*load_model(tiny))


def mixed_prompts(n=10, seed=0, shared_prefix=0):
    """n prompts of lengths 1..40 (token ids), optionally all opening with one prefix."""
    rng = np.random.default_rng(seed)
    prefix = list(rng.integers(3, 262, shared_prefix))
    return [prefix + list(rng.integers(3, 262, int(rng.integers(1, 40)))) for _ in range(n)]


def assert_outputs_equal_dense(outputs, prompts, oracle, max_tokens):
    for out, prompt in zip(outputs, prompts):
        assert out.token_ids == dense_greedy(oracle, prompt, max_tokens), f"prompt {prompt[:5]}"


@pytest.mark.parametrize("block_size", [1, 16, 32])
@pytest.mark.parametrize("prefix_caching", [True, False])
def test_greedy_batch_equals_dense_reference(tiny, oracle, block_size, prefix_caching):
    prompts = mixed_prompts(10, seed=block_size, shared_prefix=20)
    llm = LLM(tiny, block_size=block_size, num_blocks=400, enable_prefix_caching=prefix_caching)
    outputs = llm.generate(prompts, GREEDY)
    assert_outputs_equal_dense(outputs, prompts, oracle, 12)
    stats = llm.stats()
    assert stats["blocks_used"] == 0  # everything went back
    hits = stats["prefix_cache_hit_tokens"]
    assert (hits > 0) == (prefix_caching and block_size <= 20)


def test_prefix_cache_hit_survives_between_requests(tiny, oracle):
    """A freed prefix keeps its blocks (cached-free) and the next request reuses them."""
    llm = LLM(tiny, block_size=4, num_blocks=64)
    system = list(range(10, 30))  # 20 tokens = 5 full blocks
    first = llm.generate([system + [40, 41]], GREEDY)[0]
    stats = llm.stats()
    assert stats["blocks_used"] == 0 and stats["blocks_cached_free"] >= 5
    computed = stats["prefill_tokens_computed"]
    second = llm.generate([system + [50, 51, 52]], GREEDY)[0]
    stats = llm.stats()
    assert stats["prefix_cache_hit_tokens"] == 20
    assert stats["prefill_tokens_computed"] - computed == 3  # only the new tokens
    assert first.token_ids == dense_greedy(oracle, system + [40, 41], 12)
    assert second.token_ids == dense_greedy(oracle, system + [50, 51, 52], 12)


def test_whole_prompt_cached_still_computes_its_last_token(tiny, oracle):
    llm = LLM(tiny, block_size=4, num_blocks=64)
    prompt = list(range(5, 21))  # exactly 4 blocks
    a = llm.generate([prompt], GREEDY)[0]
    before = llm.stats()["prefill_tokens_computed"]
    b = llm.generate([prompt], GREEDY)[0]
    assert llm.stats()["prefill_tokens_computed"] - before == 4  # the last block is recomputed
    assert a.token_ids == b.token_ids == dense_greedy(oracle, prompt, 12)


def test_parallel_samples_share_the_prompt_and_differ(tiny):
    llm = LLM(tiny, block_size=4, num_blocks=64)
    prompt = list(range(3, 30))  # 27 tokens: 6 full blocks + a partial one
    params = SamplingParams(n=4, temperature=1.0, max_tokens=8, seed=3, ignore_eos=True)
    engine = llm.engine
    engine.add_request(prompt, params, request_id="r")
    engine.step()  # prefill once, fork into 4
    seqs = engine.requests["r"].seqs
    assert len(seqs) == 4
    assert engine.stats()["prefill_tokens_computed"] == 27
    shared = set(seqs[0].block_table[:6])
    for seq in seqs[1:]:
        assert set(seq.block_table[:6]) == shared
    for block_id in shared:
        assert engine.block_manager.blocks[block_id].ref_count == 4
    engine.step()  # each sample writes its first token: the shared partial block is copied
    partial = [seq.block_table[6] for seq in seqs]
    assert len(set(partial)) == 4
    engine.block_manager.check_invariants(seqs)
    while engine.has_unfinished():
        outputs = engine.step()
    result = outputs[0]
    assert len(result.outputs) == 4 and result.finished
    texts = {tuple(o.token_ids) for o in result.outputs}
    assert len(texts) > 1  # different random streams
    assert engine.stats()["blocks_used"] == 0


def test_parallel_samples_never_exceed_max_num_seqs(tiny):
    """n samples are forked after the prompt, without admission: admission keeps their
    places (issue 18, A5: 40 prompts with n=32 ran 1,056 sequences under a limit of 64)."""
    llm = LLM(tiny, backend="cpu", block_size=4, num_blocks=400, max_num_seqs=8)
    engine = llm.engine
    params = SamplingParams(n=3, temperature=1.0, max_tokens=6, seed=1, ignore_eos=True)
    for i in range(6):
        engine.add_request([3 + i, 4, 5], params, request_id=f"r{i}")
    peak, finished = 0, 0
    while engine.has_unfinished():
        finished += sum(out.finished for out in engine.step())
        peak = max(peak, len(engine.scheduler.running))
        assert len(engine.scheduler.running) <= 8
    assert finished == 6 and peak >= 6  # two requests' samples at once, not one
    assert engine.stats()["blocks_used"] == 0


def test_a_seed_gives_the_same_text_whatever_else_is_in_the_batch(tiny):
    llm = LLM(tiny, num_blocks=200)
    params = SamplingParams(temperature=0.9, top_k=50, max_tokens=10, seed=11, ignore_eos=True)
    alone = llm.generate([[5, 6, 7]], params)[0]
    others = SamplingParams(temperature=1.0, max_tokens=15, ignore_eos=True)
    batch = llm.generate([[9, 9], [5, 6, 7], [4] * 30], [others, params, others])
    assert batch[1].token_ids == alone.token_ids


def test_preemption_under_pressure_keeps_every_output(tiny):
    prompts = mixed_prompts(32, seed=5)
    params = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    roomy = LLM(tiny, block_size=4, num_blocks=1000).generate(prompts, params)
    tight_llm = LLM(tiny, block_size=4, num_blocks=24)  # ~96 token slots for 32 requests
    tight = tight_llm.generate(prompts, params)
    assert [o.token_ids for o in tight] == [o.token_ids for o in roomy]
    stats = tight_llm.stats()
    assert stats["preemptions"] > 0 and stats["blocks_used"] == 0


def test_continuous_batching_admits_and_retires_every_step(tiny):
    llm = LLM(tiny, num_blocks=100)
    engine = llm.engine
    engine.add_request([1, 2, 3], SamplingParams(temperature=0, max_tokens=2, ignore_eos=True), "short")
    engine.add_request([4, 5, 6], SamplingParams(temperature=0, max_tokens=6, ignore_eos=True), "long")
    engine.step()
    engine.step()
    assert [s.request_id for s in engine.scheduler.running] == ["long"]  # short retired at once
    engine.add_request([7, 8], SamplingParams(temperature=0, max_tokens=2, ignore_eos=True), "late")
    engine.step()
    assert {s.request_id for s in engine.scheduler.running} == {"long", "late"}  # joined mid-run


def test_stop_strings_stop_tokens_and_max_tokens(tiny):
    llm = LLM(tiny, num_blocks=100)
    free = llm.generate([[10, 11]], SamplingParams(temperature=0, max_tokens=30, ignore_eos=True))[0]
    assert free.finish_reason == "length" and len(free.token_ids) == 30
    stop_token = free.token_ids[5]
    cut = llm.generate([[10, 11]], SamplingParams(temperature=0, max_tokens=30, ignore_eos=True,
                                                   stop_token_ids=[stop_token]))[0]
    assert cut.finish_reason == "stop"  # the stop token is output (as vLLM's), its text is not
    assert cut.token_ids == free.token_ids[:free.token_ids.index(stop_token) + 1]
    before = llm.generate([[10, 11]], SamplingParams(temperature=0, ignore_eos=True,
                                                     max_tokens=len(cut.token_ids) - 1))[0]
    assert cut.text == before.text
    text = free.text
    stop = text[len(text) // 2: len(text) // 2 + 2]
    stopped = llm.generate([[10, 11]], SamplingParams(temperature=0, max_tokens=30,
                                                       ignore_eos=True, stop=[stop]))[0]
    assert stopped.finish_reason == "stop" and stopped.text == text[:text.index(stop)]
    streamed = "".join(llm.stream([10, 11], SamplingParams(temperature=0, max_tokens=30,
                                                            ignore_eos=True, stop=[stop])))
    assert streamed == stopped.text


def test_repetition_penalty_and_min_p_change_sampling_as_specified(tiny, oracle):
    llm = LLM(tiny, num_blocks=100)
    prompt = [20, 21, 22]
    greedy = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=1))[0].token_ids[0]
    logits = oracle.forward(prompt + [greedy], oracle.new_cache())[-1].astype(np.float64)
    penalised = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=2,
                                                      repetition_penalty=1e6))[0].token_ids
    seen = set(prompt + [greedy])
    assert penalised[1] not in seen or logits.max() <= 0
    # min_p = 1 keeps only the most likely token: sampling becomes greedy
    hot = llm.generate([prompt], SamplingParams(temperature=2.0, min_p=1.0, max_tokens=8,
                                                ignore_eos=True, seed=0))[0]
    assert hot.token_ids == dense_greedy(oracle, prompt, 8)


def test_one_prompt_of_token_ids_is_one_request(tiny, oracle):
    outputs = LLM(tiny, num_blocks=50).generate([5, 6, 7], GREEDY)
    assert len(outputs) == 1 and outputs[0].token_ids == dense_greedy(oracle, [5, 6, 7], 12)


@pytest.mark.parametrize("budget", [1, 7, 16])
def test_chunked_prefill_gives_the_same_outputs(tiny, oracle, budget):
    prompts = mixed_prompts(6, seed=9, shared_prefix=10)
    chunked = LLM(tiny, block_size=4, num_blocks=300, max_num_batched_tokens=budget)
    outputs = chunked.generate(prompts, GREEDY)
    assert_outputs_equal_dense(outputs, prompts, oracle, 12)
    assert chunked.stats()["blocks_used"] == 0


def test_running_requests_keep_decoding_while_a_long_prompt_is_read(tiny):
    llm = LLM(tiny, block_size=4, num_blocks=100, max_num_batched_tokens=8)
    engine = llm.engine
    engine.add_request([5, 6], SamplingParams(temperature=0, max_tokens=30, ignore_eos=True), "chat")
    engine.step()  # the short prompt is read and decodes from now on
    engine.add_request(list(range(3, 63)), GREEDY, "long")  # 60 tokens: 8 steps at 7 a step
    long_seq = engine.requests["long"].seqs[0]
    reads = []
    for _ in range(9):
        before = len(engine.requests["chat"].seqs[0])
        engine.step()
        assert len(engine.requests["chat"].seqs[0]) == before + 1  # a token every step
        reads.append(long_seq.num_computed_tokens)
    assert reads[:3] == [7, 14, 21]  # 8-token budget minus the chat's decode token
    assert long_seq.num_output_tokens >= 1  # its prompt was read in chunks, then sampled


def test_block_map_shows_sharing_and_tables(tiny):
    llm = LLM(tiny, block_size=4, num_blocks=40)
    engine = llm.engine
    engine.add_request(list(range(3, 13)), SamplingParams(n=3, temperature=1, max_tokens=5,
                                                          ignore_eos=True, seed=0), "r")
    engine.step()
    picture = engine.block_map().splitlines()
    assert picture[0].startswith("KV pool: 40 blocks x 4 tokens")
    assert picture[1][:3] == "333"  # 10 prompt tokens: 3 blocks held by all 3 samples
    assert picture[1][3:] == "." * 37
    tables = [line for line in picture if line.startswith("request r")]
    assert len(tables) == 3 and all("blocks [0 1 2]" in t for t in tables)
    while engine.has_unfinished():
        engine.step()
    assert set(engine.block_map().splitlines()[1]) <= {"c", "."}  # freed, prompt blocks cached
    assert "3" in engine.statistics.peak_block_map.splitlines()[1]
