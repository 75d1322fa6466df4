"""The paged engine on the real SmolLM2: token for token equal to the dense reference."""
import pytest

from helpers import dense_greedy
from tinypaged import LLM, SamplingParams

MAX_TOKENS = 16
QUESTIONS = ["What is the capital of France?", "Name a planet.",
             "Write one sentence about the sea and the ships that sail on it.",
             "Why is the sky blue?", "List three fruits.", "hi",
             "Explain in simple words what a computer program is and why people write them.",
             "What is 12 + 30?"]


@pytest.fixture(scope="module")
def prompts_and_expected(smollm2, smollm2_reference):
    """Chat prompts (they share the template's system prompt) and the dense greedy outputs."""
    prompts = [smollm2.chat_prompt([{"role": "user", "content": q}]) for q in QUESTIONS[:6]]
    prompts += ["The capital of France is", "Once upon a time, in a small village by the sea,"]
    ids = [smollm2.tokenizer.encode(p) for p in prompts]
    eos = smollm2.engine.eos_token_ids
    return prompts, [dense_greedy(smollm2_reference, i, MAX_TOKENS, eos) for i in ids]


@pytest.mark.parametrize("block_size", [1, 16, 32])
@pytest.mark.parametrize("prefix_caching", [True, False])
def test_engine_equals_dense_reference_on_smollm2(smollm2_dir, prompts_and_expected,
                                                  block_size, prefix_caching):
    prompts, expected = prompts_and_expected
    llm = LLM(smollm2_dir, block_size=block_size, enable_prefix_caching=prefix_caching,
              kv_cache_memory=256 << 20)
    outputs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=MAX_TOKENS))
    assert [o.token_ids for o in outputs] == expected
    stats = llm.stats()
    # the shared chat header (~30 tokens) fills a 1- or 16-token block, not a 32-token one
    assert (stats["prefix_cache_hit_tokens"] > 0) == (prefix_caching and block_size < 32)
    assert stats["blocks_used"] == 0


def test_shared_system_prompt_is_computed_once(smollm2):
    chats = [smollm2.chat_prompt([{"role": "user", "content": q}]) for q in QUESTIONS]
    before = smollm2.stats()
    smollm2.generate(chats[:1], SamplingParams(temperature=0, max_tokens=2))
    smollm2.generate(chats[1:], SamplingParams(temperature=0, max_tokens=2))
    after = smollm2.stats()
    prompt_tokens = sum(len(smollm2.tokenizer.encode(c)) for c in chats)
    computed = after["prefill_tokens_computed"] - before["prefill_tokens_computed"]
    assert after["prefix_cache_hit_tokens"] > before["prefix_cache_hit_tokens"]
    assert computed < prompt_tokens * 0.75  # the ~30-token system prompt is found in cache


def test_chunked_prefill_on_smollm2_gives_the_same_outputs(smollm2_dir, prompts_and_expected):
    prompts, expected = prompts_and_expected
    llm = LLM(smollm2_dir, kv_cache_memory=256 << 20, max_num_batched_tokens=13)
    outputs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=MAX_TOKENS))
    assert [o.token_ids for o in outputs] == expected
    assert max(len(llm.tokenizer.encode(p)) for p in prompts) > 13  # so it was read in chunks
    assert llm.stats()["steps"] > MAX_TOKENS + len(prompts)


@pytest.mark.parametrize("weights", ["gguf_q4_1", "q8_0_at_load", "q4_0_at_load"])
def test_packed_greedy_output_does_not_depend_on_the_batch(smollm2_dir, smollm2_gguf, weights):
    """Packed products round x to int8 blocks: a step function, so float32 noise
    between two kernels could flip a rounding and then the text. Every packed kernel
    gives a row the same bits whatever the batch (kernels/cpu/LANES.md), so a
    request's greedy text is the same alone, in a batch of 20 (prefill of 200+ rows
    at once) and when the batch shrinks as others finish."""
    if weights == "gguf_q4_1":
        llm = LLM(smollm2_gguf, kv_cache_memory=128 << 20)
    else:
        llm = LLM(smollm2_dir, kv_cache_memory=128 << 20, quantization=weights.split("_")[0] + "_0")
    prompts = [f"Write one sentence about the number {i}." for i in range(14)] + QUESTIONS[:6]
    params = [SamplingParams(temperature=0, max_tokens=8 + 2 * i, ignore_eos=True)
              for i in range(len(prompts))]  # different lengths: the batch shrinks step by step
    together = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
    for i in (0, 5, 13, 19):
        assert llm.generate([prompts[i]], params[i])[0].outputs[0].token_ids == together[i], i
