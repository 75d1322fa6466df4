"""The OpenAI-compatible server, driven by the official `openai` client and by raw HTTP:
both endpoints streamed and not, the SSE framing, usage, logprobs and metrics, and
the real SmolLM2 behind it."""
import json

import httpx
import pytest

from serving import ServerThread, client_for, running_server, running_tiny_chat_server, sse_events
from tinypaged import LLM, SamplingParams


@pytest.fixture(scope="module")
def stories(stories_dir):
    yield from running_server(stories_dir, served_model_name="stories")


@pytest.fixture(scope="module")
def tiny_chat(tmp_path_factory):
    yield from running_tiny_chat_server(tmp_path_factory.mktemp("serve") / "tiny")


# -- completions -------------------------------------------------------------------

def test_completions_with_n_stop_seed_logprobs_and_usage(stories):
    client, llm = client_for(stories), stories.llm
    kwargs = dict(max_tokens=40, temperature=0.8, seed=7, n=2, stop=[" Lily"], logprobs=2)
    out = client.completions.create(model="stories", prompt="Once upon a time", **kwargs)
    lib = llm.generate("Once upon a time", SamplingParams(**kwargs))[0]
    assert out.object == "text_completion" and out.model == "stories" and out.id.startswith("cmpl-")
    assert [c.index for c in out.choices] == [0, 1]
    assert [c.text for c in out.choices] == [o.text for o in lib.outputs]
    assert [c.finish_reason for c in out.choices] == [o.finish_reason for o in lib.outputs]
    for choice, sample in zip(out.choices, lib.outputs):
        assert len(choice.logprobs.tokens) == len(sample.token_ids)
        assert choice.logprobs.token_logprobs == pytest.approx([e.logprob for e in sample.token_logprobs])
        assert all(len(top) <= 2 for top in choice.logprobs.top_logprobs)
        assert choice.logprobs.text_offset[0] == 0
    assert out.usage.prompt_tokens == len(lib.prompt_token_ids)
    assert out.usage.completion_tokens == sum(len(o.token_ids) for o in lib.outputs)
    assert out.usage.total_tokens == out.usage.prompt_tokens + out.usage.completion_tokens
    again = client.completions.create(model="stories", prompt="Once upon a time", **kwargs)
    assert [c.text for c in again.choices] == [c.text for c in out.choices]  # the seed holds


def test_completions_stream_matches_the_whole_answer(stories):
    client = client_for(stories)
    kwargs = dict(model="stories", prompt=["Once upon a time", "The dog"], max_tokens=30,
                  temperature=0, n=2, stop="park", logprobs=1)
    whole = client.completions.create(**kwargs)
    chunks = list(client.completions.create(stream=True, stream_options={"include_usage": True},
                                            **kwargs))
    texts, finishes, tokens = {}, {}, {}
    for chunk in chunks[:-1]:
        assert chunk.object == "text_completion" and chunk.usage is None
        for c in chunk.choices:
            texts[c.index] = texts.get(c.index, "") + c.text
            tokens[c.index] = tokens.get(c.index, 0) + len(c.logprobs.tokens)
            if c.finish_reason:
                assert c.index not in finishes
                finishes[c.index] = c.finish_reason
    assert texts == {c.index: c.text for c in whole.choices}
    assert finishes == {c.index: c.finish_reason for c in whole.choices}
    assert tokens == {c.index: len(c.logprobs.tokens) for c in whole.choices}
    # the same usage, but for the prefix cache: the stream's prompt was cached by then
    last = chunks[-1].usage
    assert chunks[-1].choices == [] and (last.prompt_tokens, last.completion_tokens) == (
        whole.usage.prompt_tokens, whole.usage.completion_tokens)
    assert last.prompt_tokens_details.cached_tokens >= whole.usage.prompt_tokens_details.cached_tokens


def test_echo_returns_the_prompt_and_its_logprobs(stories):
    out = client_for(stories).completions.create(model="stories", prompt="Once upon a time",
                                                 max_tokens=5, temperature=0, echo=True, logprobs=1)
    choice, prompt_ids = out.choices[0], stories.llm.tokenizer.encode("Once upon a time")
    assert choice.text.startswith("Once upon a time")
    lp = choice.logprobs
    assert len(lp.tokens) == len(prompt_ids) + out.usage.completion_tokens
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert all(isinstance(x, float) for x in lp.token_logprobs[1:])
    assert lp.text_offset == sorted(lp.text_offset)


def test_token_id_prompts(stories):
    ids = stories.llm.tokenizer.encode("Once upon a time")
    out = client_for(stories).completions.create(model="stories", prompt=[ids, ids[:3]],
                                                 max_tokens=6, temperature=0)
    expected = stories.llm.generate([ids, ids[:3]], SamplingParams(max_tokens=6, temperature=0))
    assert [c.text for c in out.choices] == [e.text for e in expected]


def test_vllm_extensions_reach_the_sampler(stories):
    llm, ids = stories.llm, stories.llm.tokenizer.encode("Once upon a time")
    greedy_first = llm.generate(ids, SamplingParams(temperature=0, max_tokens=1))[0].token_ids[0]
    extra = {"top_k": 5, "min_p": 0.05, "repetition_penalty": 1.3, "ignore_eos": True,
             "stop_token_ids": [greedy_first]}
    r = httpx.post(stories.url + "/v1/completions", timeout=30, json={
        "prompt": "Once upon a time", "max_tokens": 20, "temperature": 0.7, "seed": 3, **extra})
    expected = llm.generate("Once upon a time", SamplingParams(max_tokens=20, temperature=0.7,
                                                               seed=3, **extra))[0]
    choice = r.json()["choices"][0]
    assert choice["text"] == expected.text and choice["finish_reason"] == expected.finish_reason
    stopped = httpx.post(stories.url + "/v1/completions", timeout=30, json={
        "prompt": "Once upon a time", "max_tokens": 20, "temperature": 0,
        "stop_token_ids": [greedy_first]}).json()
    assert stopped["choices"][0] == {"index": 0, "text": "", "logprobs": None, "finish_reason": "stop"}
    assert stopped["usage"]["completion_tokens"] == 1  # the stop token counts, as vLLM counts it


# -- chat ------------------------------------------------------------------------------

def test_chat_with_n_stop_seed_logprobs_streamed_and_not(tiny_chat):
    client, llm = client_for(tiny_chat), tiny_chat.llm
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "the the"}]
    kwargs = dict(model="tiny", messages=messages, max_tokens=20, temperature=1.0, seed=11, n=2,
                  stop=["th"], logprobs=True, top_logprobs=3)
    whole = client.chat.completions.create(**kwargs)
    lib = llm.generate(llm.chat_prompt(messages), SamplingParams(
        max_tokens=20, temperature=1.0, seed=11, n=2, stop=["th"], logprobs=3))[0]
    assert whole.object == "chat.completion" and whole.id.startswith("chatcmpl-")
    assert [c.message.content for c in whole.choices] == [o.text for o in lib.outputs]
    assert all(c.message.role == "assistant" for c in whole.choices)
    for choice, sample in zip(whole.choices, lib.outputs):
        content = choice.logprobs.content
        assert [e.logprob for e in content] == pytest.approx([e.logprob for e in sample.token_logprobs])
        assert all(len(e.top_logprobs) == 3 and isinstance(e.bytes, list) for e in content)
    assert whole.usage.completion_tokens == sum(len(o.token_ids) for o in lib.outputs)
    assert whole.usage.prompt_tokens == len(lib.prompt_token_ids)

    chunks = list(client.chat.completions.create(stream=True, stream_options={"include_usage": True},
                                                 **kwargs))
    texts, roles, finishes = {}, {}, {}
    for chunk in chunks[:-1]:
        assert chunk.object == "chat.completion.chunk"
        for c in chunk.choices:
            if c.index not in roles:  # the first delta of a choice names the role
                roles[c.index] = c.delta.role
            texts[c.index] = texts.get(c.index, "") + (c.delta.content or "")
            if c.finish_reason:
                finishes[c.index] = c.finish_reason
    assert roles == {0: "assistant", 1: "assistant"}
    assert texts == {c.index: c.message.content for c in whole.choices}
    assert finishes == {c.index: c.finish_reason for c in whole.choices}
    assert set(finishes.values()) <= {"stop", "length"}
    # the same usage, but for the prefix cache: the stream's prompt was cached by then
    last = chunks[-1].usage
    assert chunks[-1].choices == [] and (last.prompt_tokens, last.completion_tokens) == (
        whole.usage.prompt_tokens, whole.usage.completion_tokens)
    assert last.prompt_tokens_details.cached_tokens >= whole.usage.prompt_tokens_details.cached_tokens


def test_max_completion_tokens_and_max_tokens_bound_chat(tiny_chat):
    client = client_for(tiny_chat)
    for key in ("max_tokens", "max_completion_tokens"):
        out = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}],
                                             temperature=0, extra_body={"ignore_eos": True},
                                             **{key: 3})
        assert out.usage.completion_tokens == 3 and out.choices[0].finish_reason == "length"


def test_sse_framing_on_the_wire(tiny_chat, stories):
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8,
            "stream": True, "temperature": 0}
    r = httpx.post(tiny_chat.url + "/v1/chat/completions", json=body, timeout=30)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = sse_events(r.text)
    assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert events[-1]["choices"][0]["finish_reason"] in ("stop", "length")
    assert all(e["object"] == "chat.completion.chunk" for e in events)
    r = httpx.post(stories.url + "/v1/completions", timeout=30, json={
        "prompt": "Once", "max_tokens": 5, "stream": True, "temperature": 0})
    events = sse_events(r.text)
    assert "".join(e["choices"][0]["text"] for e in events)
    assert all("usage" not in e for e in events)  # only with include_usage


# -- the other routes ---------------------------------------------------------------------

def test_models_health_and_metrics(stories):
    client = client_for(stories)
    assert [m.id for m in client.models.list().data] == ["stories"]
    assert client.models.retrieve("stories").id == "stories"
    assert httpx.get(stories.url + "/health").json() == {"status": "ok"}
    spec = httpx.get(stories.url + "/openapi.json").json()  # and /docs renders it
    assert {"/v1/completions", "/v1/chat/completions", "/v1/models"} <= set(spec["paths"])
    client.completions.create(model="stories", prompt="Once upon a time", max_tokens=8)
    r = httpx.get(stories.url + "/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    values = {}
    for line in r.text.splitlines():
        if not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            values[name] = float(value)
    label = '{model_name="stories"}'
    for name in ("num_requests_running", "num_requests_waiting", "kv_cache_usage_perc",
                 "prefix_cache_queries_total", "prefix_cache_hits_total", "prompt_tokens_total",
                 "generation_tokens_total", "num_preemptions_total"):
        assert f"vllm:{name}{label}" in values, name
    assert values[f"vllm:generation_tokens_total{label}"] >= 8
    assert values[f"vllm:prompt_tokens_total{label}"] >= 5
    assert values[f"vllm:num_requests_running{label}"] == 0
    for hist in ("time_to_first_token_seconds", "inter_token_latency_seconds",
                 "e2e_request_latency_seconds"):
        count = values[f"vllm:{hist}_count{label}"]
        assert count >= 1 and values[f'vllm:{hist}_bucket{{model_name="stories",le="+Inf"}}'] == count
    assert values['vllm:request_success_total{model_name="stories",finished_reason="length"}'] >= 1


@pytest.mark.slow
def test_smollm2_answers_the_openai_client(smollm2_dir):
    llm = LLM(smollm2_dir, kv_cache_memory=64 << 20)
    server = ServerThread(llm)
    try:
        client = client_for(server)
        question = [{"role": "user", "content": "What is the capital of France?"}]
        out = client.chat.completions.create(model="smollm2-135m-instruct", messages=question,
                                             max_tokens=16, temperature=0)
        assert "Paris" in out.choices[0].message.content
        stream = client.chat.completions.create(model="smollm2-135m-instruct", messages=question,
                                                max_tokens=16, temperature=0, stream=True)
        text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        assert text == out.choices[0].message.content
        # held to a JSON object, the answer parses (a sample that ran to max_tokens
        # would not; each seed that stops must, and most stop)
        ask = [{"role": "user", "content": "Describe a cat as a JSON object."}]
        stopped = 0
        for seed in range(1, 4):
            out = client.chat.completions.create(model="any-name", messages=ask, seed=seed,
                                                 max_tokens=100, response_format={"type": "json_object"})
            if out.choices[0].finish_reason == "stop":
                assert isinstance(json.loads(out.choices[0].message.content), dict)
                stopped += 1
        assert stopped >= 2
    finally:
        server.stop()
        llm.close()


def test_a_speculating_server_answers_as_without_and_counts_its_proposals(stories_dir, monkeypatch):
    """--speculative-config's engine behind the server (taking every proposal it can):
    a greedy completion is plain decoding's, and /metrics carries vLLM's spec_decode
    counters."""
    from tinypaged.engine.draft_sizer import DraftSizer
    monkeypatch.setattr(DraftSizer, "choose", lambda self, rates, plain: [self.sizes[-1]] * len(rates))
    plain = LLM(stories_dir, backend="cpu").generate(
        "Tom and Sue went to the park. Tom and Sue", SamplingParams(temperature=0, max_tokens=40))
    llm = LLM(stories_dir, backend="cpu", kv_cache_memory=16 << 20,
              speculative_config={"method": "ngram", "num_speculative_tokens": 3})
    server = ServerThread(llm, served_model_name="stories")
    try:
        answer = client_for(server).completions.create(
            model="stories", prompt="Tom and Sue went to the park. Tom and Sue", max_tokens=40,
            temperature=0)
        assert answer.choices[0].text == plain[0].outputs[0].text
        text = httpx.get(server.url + "/metrics").text
        values = {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
                  for line in text.splitlines() if not line.startswith("#")}
        label = '{model_name="stories"}'
        drafts = values[f"vllm:spec_decode_num_drafts_total{label}"]
        proposed = values[f"vllm:spec_decode_num_draft_tokens_total{label}"]
        accepted = values[f"vllm:spec_decode_num_accepted_tokens_total{label}"]
        by_position = [values[f'vllm:spec_decode_num_accepted_tokens_per_pos_total'
                              f'{{model_name="stories",position="{i}"}}'] for i in range(3)]
        assert 0 < accepted < proposed and drafts <= proposed and sum(by_position) == accepted
        assert by_position == sorted(by_position, reverse=True)  # (a later position needs the earlier)
        assert llm.stats()["spec_num_draft_tokens"] == proposed
    finally:
        server.stop()
        llm.close()
