"""vLLM's sampling options beyond OpenAI's: min_tokens, include_stop_str_in_output,
skip_special_tokens, allowed_token_ids, bad_words, and -1 / None meaning off."""
import pytest

from tinypaged import LLM, SamplingParams

PROMPT = "Once upon a time"
GREEDY = dict(temperature=0, max_tokens=24)


@pytest.fixture(scope="module")
def stories(stories_dir):
    return LLM(stories_dir)


def test_min_tokens_holds_back_stop_tokens_and_stop_strings(stories):
    free = stories.generate(PROMPT, SamplingParams(**GREEDY, ignore_eos=True))[0]
    first = free.token_ids[0]
    stopped = stories.generate(PROMPT, SamplingParams(**GREEDY, stop_token_ids=[first]))[0]
    assert stopped.token_ids == [first] and stopped.outputs[0].finish_reason == "stop"
    assert stopped.text == ""  # (the stop token's text only with include_stop_str_in_output)
    held = stories.generate(PROMPT, SamplingParams(**GREEDY, stop_token_ids=[first],
                                                   min_tokens=6))[0]
    assert len(held.token_ids) >= 6 and first not in held.token_ids[:6]
    word = free.text.split()[0]  # a stop string in the first few tokens' text
    text = stories.generate(PROMPT, SamplingParams(**GREEDY, ignore_eos=True, stop=[word],
                                                   min_tokens=12))[0]
    assert len(text.token_ids) >= 12


def test_include_stop_str_in_output(stories):
    free = stories.generate(PROMPT, SamplingParams(**GREEDY, ignore_eos=True))[0].text
    stop = free.split()[2]
    cut = stories.generate(PROMPT, SamplingParams(**GREEDY, ignore_eos=True, stop=[stop]))[0].text
    kept = stories.generate(PROMPT, SamplingParams(**GREEDY, ignore_eos=True, stop=[stop],
                                                   include_stop_str_in_output=True))[0].text
    assert kept == cut + stop and free.startswith(kept)


def test_skip_special_tokens_false_shows_them(stories):
    bos = 1  # "<s>" in stories260K's vocabulary
    params = dict(temperature=0, max_tokens=3, allowed_token_ids=[bos], ignore_eos=True)
    shown = stories.generate(PROMPT, SamplingParams(**params, skip_special_tokens=False))[0]
    hidden = stories.generate(PROMPT, SamplingParams(**params))[0]
    assert shown.token_ids == hidden.token_ids == [bos] * 3
    assert shown.text == "<s><s><s>" and hidden.text == ""


def test_allowed_token_ids_are_all_that_is_sampled(stories):
    allowed = list(range(300, 340))
    outs = stories.generate([PROMPT] * 8, [SamplingParams(max_tokens=16, seed=s,
                                                          allowed_token_ids=allowed)
                                           for s in range(8)])
    assert all(set(o.token_ids) <= set(allowed) and len(o.token_ids) == 16 for o in outs)
    with pytest.raises(ValueError, match="allowed_token_ids: token id 9999 is out of range"):
        stories.generate(PROMPT, SamplingParams(allowed_token_ids=[1, 9999]))
    with pytest.raises(ValueError, match="allowed_token_ids is empty"):
        SamplingParams(allowed_token_ids=[])


def test_bad_words_are_never_generated(stories):
    free = stories.generate(PROMPT, SamplingParams(**GREEDY, ignore_eos=True))[0]
    words = free.text.split()[:3]
    out = stories.generate(PROMPT, SamplingParams(**GREEDY, ignore_eos=True, bad_words=words))[0]
    tokenizer = stories.tokenizer
    for word in words:
        for text in (word, " " + word):
            ids = tokenizer.encode(text, add_special_tokens=False)
            assert not any(out.token_ids[i:i + len(ids)] == ids
                           for i in range(len(out.token_ids))), (word, out.text)
    assert out.text != free.text


def test_minus_one_and_none_mean_off(stories_dir):
    assert SamplingParams(top_k=-1).top_k == 0
    off = SamplingParams(stop=None, stop_token_ids=None, logit_bias=None, bad_words=None)
    assert (off.stop, off.stop_token_ids, off.logit_bias, off.bad_words) == ([], [], {}, [])
    llm = LLM(stories_dir, max_model_len=40)
    out = llm.generate(PROMPT, SamplingParams(max_tokens=None, temperature=0, top_k=-1,
                                              ignore_eos=True, seed=None))[0]
    assert len(out.prompt_token_ids) + len(out.token_ids) == 40
    assert out.outputs[0].finish_reason == "length"
