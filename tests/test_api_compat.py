"""What apps written for OpenAI's and vLLM's APIs send, accepted: fields that do not
apply and unknown ones, any model name, /tokenize and /detokenize, cached_tokens,
vLLM's sampling fields over HTTP, and vLLM's offline names and shapes."""
import httpx
import pytest

from serving import client_for, running_server, running_tiny_chat_server
from tinypaged import LLM, SamplingParams
from tinypaged.outputs import Logprob

COMPLETIONS = "/v1/completions"
IGNORED = {"metadata": {"app": "x"}, "store": False, "service_tier": "auto", "user": "u1",
           "parallel_tool_calls": True, "reasoning_effort": "low", "some_new_field": [1, 2],
           "x" * 1000: {"nested": True}}


@pytest.fixture(scope="module")
def stories(stories_dir):
    yield from running_server(stories_dir, served_model_name="stories")


@pytest.fixture(scope="module")
def tiny_chat(tmp_path_factory):
    yield from running_tiny_chat_server(tmp_path_factory.mktemp("serve") / "tiny")


def post(server, body, path=COMPLETIONS):
    return httpx.post(server.url + path, json=body, timeout=120)


def test_fields_that_do_not_apply_and_unknown_ones_are_ignored(stories, tiny_chat):
    base = {"prompt": "Once upon a time", "max_tokens": 6, "temperature": 0}
    plain = post(stories, base).json()["choices"][0]["text"]
    r = post(stories, {**base, **IGNORED})
    assert r.status_code == 200 and r.json()["choices"][0]["text"] == plain
    assert "x" * 1000 not in r.text
    chat = post(tiny_chat, {"messages": [{"role": "user", "content": "hi", "audio": None}],
                            "max_tokens": 4, **IGNORED}, "/v1/chat/completions")
    assert chat.status_code == 200, chat.text
    # a known field with a wrong type is still a 400 naming it
    r = post(stories, {**base, **IGNORED, "temperature": "hot"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "temperature"


def test_any_model_name_is_served_and_the_answer_names_the_real_one(stories):
    client = client_for(stories)
    out = client.completions.create(model="gpt-4o-mini", prompt="Once upon a time", max_tokens=3)
    assert out.model == "stories" and out.choices[0].text
    assert httpx.get(stories.url + "/v1/models/gpt-4o-mini").json()["id"] == "stories"


def test_strict_model_name_restores_the_404(stories_dir):
    gen = running_server(stories_dir, served_model_name="stories", strict_model_name=True)
    server = next(gen)
    try:
        r = post(server, {"prompt": "hi", "model": "gpt-4o-mini"})
        assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
        assert post(server, {"prompt": "hi", "model": "stories", "max_tokens": 2}).status_code == 200
    finally:
        gen.close()


def test_tokenize_and_detokenize_as_vllm_has_them(stories, tiny_chat):
    tokenizer = stories.llm.tokenizer
    r = post(stories, {"prompt": "Once upon a time"}, "/tokenize").json()
    assert r["tokens"] == tokenizer.encode("Once upon a time") and r["count"] == len(r["tokens"])
    assert r["max_model_len"] == stories.llm.max_model_len
    bare = post(stories, {"prompt": "Once", "add_special_tokens": False}, "/tokenize").json()
    assert bare["tokens"] == tokenizer.encode("Once", add_special_tokens=False)
    back = post(stories, {"tokens": r["tokens"]}, "/detokenize").json()
    assert back == {"prompt": tokenizer.decode(r["tokens"])}
    messages = [{"role": "user", "content": "hi"}]
    chat = post(tiny_chat, {"messages": messages}, "/tokenize").json()
    assert chat["tokens"] == tiny_chat.llm.chat_prompt_ids(messages)
    for body, path in (({"tokens": [10 ** 6]}, "/detokenize"), ({}, "/tokenize"),
                       ({"prompt": "a", "messages": messages}, "/tokenize")):
        assert post(stories, body, path).status_code == 400


def test_usage_counts_cached_prompt_tokens(stories):
    prompt = "Once upon a time, there was a little girl named Lily. She liked to play " * 3
    first = post(stories, {"prompt": prompt, "max_tokens": 2}).json()["usage"]
    again = post(stories, {"prompt": prompt, "max_tokens": 2}).json()["usage"]
    assert again["prompt_tokens_details"]["cached_tokens"] >= 16
    assert again["prompt_tokens_details"]["cached_tokens"] > first["prompt_tokens_details"]["cached_tokens"]
    assert again["prompt_tokens_details"]["cached_tokens"] < again["prompt_tokens"]


def test_vllm_sampling_fields_reach_the_sampler_over_http(stories):
    llm = stories.llm
    fields = {"min_tokens": 5, "include_stop_str_in_output": True, "stop": ["the"],
              "skip_special_tokens": False, "allowed_token_ids": list(range(300, 400)),
              "bad_words": ["cat"]}
    r = post(stories, {"prompt": "Once upon a time", "max_tokens": 12, "seed": 2, **fields})
    assert r.status_code == 200, r.text
    lib = llm.generate("Once upon a time", SamplingParams(max_tokens=12, seed=2, **fields))[0]
    assert r.json()["choices"][0]["text"] == lib.text
    r = post(stories, {"prompt": "Once upon a time", "max_tokens": 2, "prompt_logprobs": 2})
    entries = r.json()["choices"][0]["prompt_logprobs"]
    prompt_ids = llm.tokenizer.encode("Once upon a time")
    assert entries[0] is None and len(entries) == len(prompt_ids)
    for token, entry in zip(prompt_ids[1:], entries[1:]):
        assert str(token) in entry and 2 <= len(entry) <= 3
        assert all(set(v) == {"logprob", "rank", "decoded_token"} for v in entry.values())


def test_vllms_offline_names_and_shapes(stories_dir, tmp_path):
    from helpers import write_tiny_model
    llm = LLM(stories_dir)
    params = SamplingParams(max_tokens=4, temperature=0, logprobs=2, top_k=-1, seed=None)
    outs = llm.generate(["Once upon a time", "The dog"], sampling_params=params, use_tqdm=True)
    again = llm.generate(["Once upon a time", "The dog"], params)
    assert [o.token_ids for o in outs] == [o.token_ids for o in again]
    for step in outs[0].outputs[0].logprobs:  # vLLM's: {token id: Logprob} per token
        assert all(isinstance(k, int) and isinstance(v, Logprob) for k, v in step.items())
    chosen = outs[0].token_ids[0]
    first = outs[0].outputs[0].logprobs[0]
    assert first[chosen].rank == 1 and first[chosen].decoded_token == llm.tokenizer.token_text(chosen)
    with pytest.raises(TypeError, match="not both"):
        llm.generate("x", sampling_params=params, params=params)
    write_tiny_model(str(tmp_path / "tiny"), seed=3, max_position_embeddings=256)
    chat_llm = LLM(tmp_path / "tiny")
    one = chat_llm.chat([{"role": "user", "content": "hi"}], params)
    two = chat_llm.chat([[{"role": "user", "content": "hi"}], [{"role": "user", "content": "yo"}]],
                        sampling_params=params)
    assert isinstance(one, list) and len(one) == 1 and len(two) == 2
    assert two[0].token_ids == one[0].token_ids
