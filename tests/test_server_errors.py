"""The server under bad requests and bad luck: every kind of malformed request gets the
right 4xx in OpenAI's error shape while the others go on; a wrong key, an oversized
body, clients that leave mid-answer, and a full queue."""
import json
import threading

import httpx
import openai
import pytest

from helpers import posted_aborts, step_gate
from serving import ServerThread, client_for, running_server, wait_until
from tinypaged import LLM


@pytest.fixture(scope="module")
def stories(stories_dir):
    yield from running_server(stories_dir)


# -- bad requests ------------------------------------------------------------------------

COMPLETIONS, CHAT = "/v1/completions", "/v1/chat/completions"
USER = [{"role": "user", "content": "hi"}]
BAD = [  # (path, json body or raw bytes, status, param)
    (COMPLETIONS, b"{not json", 400, None),
    (COMPLETIONS, b"[1, 2]", 400, None),
    (COMPLETIONS, {"max_tokens": 5}, 400, "prompt"),
    (COMPLETIONS, {"prompt": 5}, 400, "prompt"),
    (COMPLETIONS, {"prompt": []}, 400, "prompt"),
    (COMPLETIONS, {"prompt": [[]]}, 400, "prompt"),
    (COMPLETIONS, {"prompt": [9999]}, 400, "prompt"),
    (COMPLETIONS, {"prompt": "hi", "temperature": "hot"}, 400, "temperature"),
    (COMPLETIONS, {"prompt": "hi", "temperature": 3}, 400, "temperature"),
    (COMPLETIONS, {"prompt": "hi", "top_p": 0}, 400, "top_p"),
    (COMPLETIONS, {"prompt": "hi", "n": 0}, 400, "n"),
    (COMPLETIONS, {"prompt": "hi", "n": 100}, 400, "n"),
    (COMPLETIONS, {"prompt": "hi", "max_tokens": 0}, 400, "max_tokens"),
    (COMPLETIONS, {"prompt": "hi", "max_tokens": 5000}, 400, "max_tokens"),
    (COMPLETIONS, {"prompt": [3] * 600}, 400, "prompt"),
    (COMPLETIONS, {"prompt": "hi", "stop": ""}, 400, "stop"),
    (COMPLETIONS, {"prompt": "hi", "stop": 5}, 400, "stop"),
    (COMPLETIONS, {"prompt": "hi", "logit_bias": {"abc": 1}}, 400, "logit_bias"),
    (COMPLETIONS, {"prompt": "hi", "logit_bias": {"5": 500}}, 400, "logit_bias"),
    (COMPLETIONS, {"prompt": "hi", "logit_bias": {"99999": 1}}, 400, "logit_bias"),
    (COMPLETIONS, {"prompt": "hi", "logprobs": 50}, 400, "logprobs"),
    (COMPLETIONS, {"prompt": "hi", "presence_penalty": 5}, 400, "presence_penalty"),
    (COMPLETIONS, {"prompt": "hi", "seed": "x"}, 400, "seed"),
    (COMPLETIONS, {"prompt": "hi", "stream_options": {"include_usage": True}}, 400, "stream_options"),
    (COMPLETIONS, {"prompt": "hi", "suffix": "x"}, 400, "suffix"),
    (CHAT, {"messages": []}, 400, "messages"),
    (CHAT, {"messages": [{"role": "robot", "content": "hi"}]}, 400, "messages"),
    (CHAT, {"messages": [{"role": "user"}]}, 400, "messages"),
    (CHAT, {"messages": USER, "top_logprobs": 2}, 400, "top_logprobs"),
    (CHAT, {"messages": USER}, 400, "messages"),  # stories260K has no chat template
    ("/v1/embeddings", {"input": []}, 400, "input"),
    ("/v1/embeddings", {"input": ""}, 400, "input"),
    ("/v1/embeddings", {"input": [9999]}, 400, "input"),
    ("/v1/embeddings", {"input": "hi", "dimensions": 3}, 400, "dimensions"),
    ("/v1/embeddings", {"input": "hi", "encoding_format": "int8"}, 400, "encoding_format"),
    ("/v1/rerank", {"query": "hi", "documents": ["a"]}, 400, "documents"),  # (stories: no "yes")
    ("/v1/rerank", {"query": "hi", "documents": []}, 400, "documents"),
    ("/v1/rerank", {"documents": ["a"]}, 400, "query"),
]


def assert_openai_error(response, status, param=None):
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    assert "Traceback" not in response.text
    if param is not None:
        assert body["error"]["param"] == param, body
    return body["error"]


@pytest.mark.parametrize("path, body, status, param", BAD,
                         ids=[f"{i}-{b if isinstance(b, bytes) else list(b)}"[:40] for i, (_, b, _, _) in enumerate(BAD)])
def test_bad_requests_get_the_right_4xx_in_openai_shape(stories, path, body, status, param):
    if isinstance(body, bytes):
        r = httpx.post(stories.url + path, content=body, headers={"content-type": "application/json"})
    else:
        r = httpx.post(stories.url + path, json=body)
    assert_openai_error(r, status, param)


def test_wrong_methods_and_context_errors_are_named(stories):
    assert_openai_error(httpx.get(stories.url + COMPLETIONS), 405)
    error = assert_openai_error(httpx.post(stories.url + COMPLETIONS, json={"prompt": [3] * 600}), 400)
    assert error["code"] == "context_length_exceeded" and "max_model_len is 512" in error["message"]


def test_bad_requests_do_not_disturb_the_others(stories):
    body = {"prompt": "Once upon a time", "max_tokens": 60, "temperature": 0, "ignore_eos": True}
    expected = httpx.post(stories.url + COMPLETIONS, json=body, timeout=30).json()["choices"][0]["text"]
    results = []

    def good():
        results.append(httpx.post(stories.url + COMPLETIONS, json=body, timeout=30).json())

    def bad(case):
        path, payload, status, _ = case
        kw = {"content": payload} if isinstance(payload, bytes) else {"json": payload}
        results.append(httpx.post(stories.url + path, timeout=30, **kw).status_code == status)
    threads = [threading.Thread(target=good) for _ in range(4)]
    threads += [threading.Thread(target=bad, args=(case,)) for case in BAD]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(r is True for r in results) == len(BAD)
    assert [r["choices"][0]["text"] for r in results if isinstance(r, dict)] == [expected] * 4
    assert stories.llm.stats()["blocks_used"] == 0


def test_api_key_and_body_size(stories_dir):
    llm = LLM(stories_dir, backend="cpu", kv_cache_memory=4 << 20)
    server = ServerThread(llm, api_key="sekrit", max_body_bytes=64 << 10)
    try:
        body = {"prompt": "Once", "max_tokens": 2}
        assert_openai_error(httpx.post(server.url + COMPLETIONS, json=body), 401)
        r = httpx.post(server.url + COMPLETIONS, json=body, headers={"Authorization": "Bearer nope"})
        assert assert_openai_error(r, 401)["type"] == "authentication_error"
        assert r.headers["www-authenticate"] == "Bearer"
        with pytest.raises(openai.AuthenticationError):
            client_for(server, "wrong").completions.create(model="stories260K", prompt="x")
        good = client_for(server, "sekrit")
        assert good.completions.create(model="stories260K", prompt="Once", max_tokens=2).choices
        assert httpx.get(server.url + "/health").status_code == 200  # probes need no key
        auth = {"Authorization": "Bearer sekrit", "content-type": "application/json"}
        big = json.dumps({"prompt": "x" * (100 << 10)}).encode()
        error = assert_openai_error(httpx.post(server.url + COMPLETIONS, content=big, headers=auth), 413)
        assert "over 65536 bytes" in error["message"]
        chunked = httpx.post(server.url + COMPLETIONS, content=iter([big[:50000], big[50000:]]),
                             headers=auth)  # no Content-Length: counted as it arrives
        assert "over 65536 bytes" in assert_openai_error(chunked, 413)["message"]
        assert good.completions.create(model="stories260K", prompt="Once", max_tokens=2).choices
    finally:
        server.stop()
        llm.close()


# -- disconnects and a full queue ----------------------------------------------------------

def test_clients_that_leave_mid_stream_free_every_block(stories, monkeypatch):
    llm = stories.llm
    # once all 8 decode, the gate holds their next step: none finishes before its client leaves
    gate = step_gate(llm, monkeypatch, close_when=lambda batch: len(batch.decodes) == 8)
    posted = posted_aborts(llm, monkeypatch)
    aborted_before = llm.metrics().finished["abort"]
    body = {"prompt": "Once upon a time", "max_tokens": 400, "ignore_eos": True, "stream": True}

    def leave_early(path, payload):
        with httpx.stream("POST", stories.url + path, json=payload, timeout=60) as r:
            lines = r.iter_lines()
            assert next(lines).startswith("data: ")  # generation is under way ...
        # ... and the connection is gone

    threads = [threading.Thread(target=leave_early, args=(COMPLETIONS, body)) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wait_until(lambda: len(set(posted)) >= 8, what="the server to see 8 clients leave")
    gate.open()
    wait_until(lambda: llm.metrics().finished["abort"] == aborted_before + 8, what="8 aborts")
    assert llm.stats()["blocks_used"] == 0 and llm.metrics().running == 0


def test_a_client_that_leaves_before_a_whole_answer_is_aborted_too(stories, monkeypatch):
    llm = stories.llm
    gate = step_gate(llm, monkeypatch, closed=True)  # no answer before the client leaves
    posted = posted_aborts(llm, monkeypatch)
    aborted_before = llm.metrics().finished["abort"]
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(stories.url + COMPLETIONS, timeout=0.3,
                   json={"prompt": "Once upon a time", "max_tokens": 400, "ignore_eos": True})
    wait_until(lambda: len(posted) >= 1, what="the server to see the client leave")
    gate.open()
    wait_until(lambda: llm.metrics().finished["abort"] == aborted_before + 1, what="the abort")
    assert llm.stats()["blocks_used"] == 0


def test_a_full_queue_answers_503_with_retry_after(stories_dir, monkeypatch):
    llm = LLM(stories_dir, backend="cpu", kv_cache_memory=4 << 20, max_num_seqs=1)
    gate = step_gate(llm, monkeypatch)
    server = ServerThread(llm, max_waiting=1)
    long = {"prompt": "Once upon a time", "max_tokens": 300, "ignore_eos": True}
    try:
        with httpx.stream("POST", server.url + COMPLETIONS, json={**long, "stream": True},
                          timeout=30) as running:
            lines = running.iter_lines()  # kept: dropping it closes the connection
            next(lines)  # the first request holds the only slot ...
            gate.close()  # ... and keeps it, however slow the machine
            waiting = []
            thread = threading.Thread(target=lambda: waiting.append(
                httpx.post(server.url + COMPLETIONS, json={**long, "max_tokens": 3}, timeout=60)))
            thread.start()
            wait_until(lambda: llm.num_waiting == 1, what="a waiting request")
            refused = httpx.post(server.url + COMPLETIONS, json={**long, "stream": True})
            assert_openai_error(refused, 503)["code"] == "server_overloaded"
            assert refused.headers["retry-after"] == "1"
            gate.open()
        thread.join(timeout=60)  # the first one left: the waiting one runs
        assert waiting[0].status_code == 200
    finally:
        server.stop()
        llm.close()


