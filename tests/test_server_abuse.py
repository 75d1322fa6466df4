"""The server under abuse (issue 18, part A): one client cannot starve the others by
what it puts in the queue, how many connections it holds, or how much it makes the
server build; and nothing a client sends turns into a 500."""
import asyncio
import logging
import socket
import threading

import httpx
import openai
import pytest

from helpers import step_gate, write_tiny_model
from serving import ServerThread, sse_events, wait_until
from test_server_errors import COMPLETIONS, assert_openai_error
from tinypaged import LLM, SamplingParams
from tinypaged.serve.connections import LogThrottle

LONG = {"prompt": "Once upon a time", "max_tokens": 300, "ignore_eos": True}


@pytest.fixture
def one_seat(stories_dir, monkeypatch):
    """A server whose engine runs two sequences at a time, slowly; start.gate, cleared,
    holds its steps."""
    llm = LLM(stories_dir, backend="cpu", kv_cache_memory=4 << 20, max_num_seqs=2)
    gate = step_gate(llm, monkeypatch)
    servers = []

    def start(**config):
        servers.append(ServerThread(llm, **config))
        return servers[-1]
    start.gate = gate
    yield start
    gate.open()
    for server in servers:
        server.stop()
    llm.close()


# -- A1: the queue ---------------------------------------------------------------------------

def test_a_batch_of_prompts_counts_prompts_times_n_against_max_waiting(one_seat):
    server = one_seat(max_waiting=4)
    llm = server.llm
    with httpx.stream("POST", server.url + COMPLETIONS, json={**LONG, "stream": True, "n": 2},
                      timeout=60) as running:
        lines = running.iter_lines()
        next(lines)  # its two samples hold both seats ...
        one_seat.gate.close()  # ... and keep them, however slow the machine
        too_many = httpx.post(server.url + COMPLETIONS, json={**LONG, "prompt": ["a", "b", "c"],
                                                             "n": 2, "max_tokens": 2})
        error = assert_openai_error(too_many, 400, "prompt")
        assert "6 sequences (3 prompts x n=2)" in error["message"] and "at most 4" in error["message"]
        waiting = []
        thread = threading.Thread(target=lambda: waiting.append(httpx.post(
            server.url + COMPLETIONS, json={**LONG, "prompt": ["a", "b"], "n": 1, "max_tokens": 2},
            timeout=120)))
        thread.start()
        wait_until(lambda: llm.num_waiting_samples == 2, what="two waiting prompts", timeout=60)
        refused = httpx.post(server.url + COMPLETIONS, json={**LONG, "prompt": ["c", "d", "e"],
                                                             "max_tokens": 2})
        assert assert_openai_error(refused, 503)["code"] == "server_overloaded"
        fits = threading.Thread(target=lambda: waiting.append(httpx.post(
            server.url + COMPLETIONS, json={**LONG, "prompt": "c", "n": 2, "max_tokens": 2},
            timeout=120)))  # 2 + 2 = 4: within the limit
        fits.start()
        wait_until(lambda: llm.num_waiting_samples == 4, what="four waiting samples", timeout=60)
        one_seat.gate.open()
    thread.join(timeout=120)
    fits.join(timeout=120)
    assert [r.status_code for r in waiting] == [200, 200]
    assert llm.stats()["blocks_used"] == 0


def test_a_request_with_too_many_prompts_is_refused_before_tokenizing(one_seat):
    server = one_seat(max_prompts_per_request=8)
    r = httpx.post(server.url + COMPLETIONS, json={"prompt": [[1]] * 9, "max_tokens": 1})
    assert "9 prompts in one request; this server takes at most 8" in \
        assert_openai_error(r, 400, "prompt")["message"]
    r = httpx.post(server.url + COMPLETIONS, json={"prompt": [[1]] * 8, "max_tokens": 1},
                   timeout=60)
    assert r.status_code == 200 and len(r.json()["choices"]) == 8


# -- A2: connections ------------------------------------------------------------------------

def connect(server) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=60)
    return sock


def read_until_closed(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection (a 60 s socket
    timeout fails the test if it never does)."""
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    sock.close()
    return data


def test_idle_connections_past_the_limit_make_room_and_requests_get_through(one_seat):
    server = one_seat(max_connections=8, header_timeout=600)  # only eviction closes them
    idle = [connect(server) for _ in range(40)]
    wait_until(lambda: len(server.server.server_state.connections) <= 9, timeout=60,
               what="the server to close idle connections")
    assert httpx.get(server.url + "/health", timeout=60).status_code == 200
    r = httpx.post(server.url + COMPLETIONS, json={"prompt": "Once", "max_tokens": 3}, timeout=60)
    assert r.status_code == 200
    for sock in idle[:30]:  # the oldest were closed to make room, without a word
        assert read_until_closed(sock) == b""
    for sock in idle[30:]:
        sock.close()


def test_a_connection_past_the_limit_gets_503_when_every_one_is_busy(one_seat):
    server = one_seat(max_connections=2, body_timeout=300)
    busy = []
    for _ in range(2):  # two requests whose bodies never finish
        sock = connect(server)
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json"
                     b"\r\ncontent-length: 100\r\n\r\n{\"prompt\"")
        busy.append(sock)
    wait_until(lambda: all(p.conn.their_state.__name__ == "SEND_BODY"
                           for p in server.server.server_state.connections)
               and len(server.server.server_state.connections) == 2, timeout=60,
               what="two connections reading bodies")
    refused = read_until_closed(connect(server))
    assert refused.startswith(b"HTTP/1.1 503 ") and b"retry-after: 1" in refused
    assert b'"code": "server_overloaded"' in refused
    for sock in busy:
        sock.close()


def test_a_client_stalled_in_its_headers_gets_408_and_is_closed(one_seat):
    server = one_seat(header_timeout=0.3)
    sock = connect(server)
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\n")  # ... and nothing more
    answer = read_until_closed(sock)
    assert answer.startswith(b"HTTP/1.1 408 ") and b"not received within 0.3 s" in answer
    silent = connect(server)  # not a byte
    assert read_until_closed(silent).startswith(b"HTTP/1.1 408 ")


def test_a_client_stalled_in_its_body_is_closed_and_leaves_nothing(one_seat):
    server = one_seat(body_timeout=0.3)
    sock = connect(server)
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json"
                 b"\r\ncontent-length: 100\r\n\r\n{\"prompt\": \"Once")
    assert read_until_closed(sock) == b""
    assert server.llm.num_waiting == 0 and server.llm.stats()["blocks_used"] == 0
    r = httpx.post(server.url + COMPLETIONS, json={"prompt": "Once", "max_tokens": 2}, timeout=60)
    assert r.status_code == 200


def test_a_stalled_client_does_not_hold_up_a_shutdown(one_seat):
    server = one_seat(shutdown_timeout=60)  # uvicorn's own backstop: 70 s
    stalled = connect(server)
    stalled.sendall(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 50\r\n\r\n{")
    partial = connect(server)
    partial.sendall(b"GET /health HTTP/1.1\r\n")
    wait_until(lambda: len(server.server.server_state.connections) == 2, timeout=60,
               what="two connections")
    server.server.should_exit = True  # what SIGINT and SIGTERM do
    server.thread.join(timeout=30)
    assert not server.thread.is_alive(), "the shutdown waited for a client that sends nothing"
    stalled.close()
    partial.close()


def test_repeated_warnings_are_throttled(caplog):
    throttle = LogThrottle(logging.getLogger("tinypaged.test"), interval=3600)
    loop = asyncio.new_event_loop()
    try:
        with caplog.at_level(logging.WARNING):
            for _ in range(1000):
                throttle.loop_exception_handler(loop, {"message": "socket.accept() out of "
                                                                  "system resource"})
                throttle.warning("evicted", "closed the one idle longest")
    finally:
        loop.close()
    lines = [r.getMessage() for r in caplog.records]
    assert sum("out of system resource" in line for line in lines) == 2  # ours, asyncio's
    assert sum("idle longest" in line for line in lines) == 1
    throttle.interval = 0
    with caplog.at_level(logging.WARNING):
        throttle.warning("evicted", "closed the one idle longest")
    assert caplog.records[-1].getMessage().endswith("(999 more like it in the last 0 s)")


# -- A3: what one request makes the server build ---------------------------------------------

def test_logprobs_over_many_echoed_prompts_are_bounded_up_front(one_seat):
    server = one_seat(max_logprob_entries=100_000)
    body = {"prompt": [[1] + [5] * 299] * 16, "echo": True, "logprobs": 20, "max_tokens": 16}
    error = assert_openai_error(httpx.post(server.url + COMPLETIONS, json=body), 400, "logprobs")
    assert "could return 106,176 logprob entries (5,056 token positions with the echoed " \
           "prompts x (1 + 20 alternatives))" in error["message"]
    assert "at most 100,000" in error["message"]
    body.update(prompt=[[1] + [5] * 299] * 2, logprobs=2)  # 2 x 316 x 3: fine
    r = httpx.post(server.url + COMPLETIONS, json=body, timeout=60)
    assert r.status_code == 200 and len(r.json()["choices"][1]["logprobs"]["tokens"]) == 316


def test_a_whole_response_is_built_off_the_event_loop(one_seat, monkeypatch):
    from tinypaged.serve import completions

    server = one_seat()
    builders = []
    real = completions.completion_choice

    def recording_choice(*args):
        builders.append(threading.get_ident())
        return real(*args)
    monkeypatch.setattr(completions, "completion_choice", recording_choice)
    r = httpx.post(server.url + COMPLETIONS, json={"prompt": ["a", "b"], "echo": True,
                                                   "logprobs": 2, "max_tokens": 4}, timeout=60)
    assert r.status_code == 200 and len(builders) == 2
    assert server.thread.ident not in builders  # the event loop's thread builds none of it


def test_chat_logprobs_are_bounded_too(tmp_path):
    write_tiny_model(str(tmp_path / "tiny"), seed=3, max_position_embeddings=512)
    with LLM(tmp_path / "tiny", backend="cpu", block_size=4, num_blocks=400) as llm:
        server = ServerThread(llm, max_logprob_entries=1000)
        try:
            chat = {"messages": [{"role": "user", "content": "hi"}], "logprobs": True,
                    "top_logprobs": 20, "n": 2, "max_tokens": 100}
            error = assert_openai_error(httpx.post(server.url + "/v1/chat/completions", json=chat),
                                        400, "top_logprobs")
            assert "4,200 logprob entries (200 token positions x (1 + 20" in error["message"]
            chat.update(max_tokens=20)
            r = httpx.post(server.url + "/v1/chat/completions", json=chat, timeout=60)
            assert r.status_code == 200
        finally:
            server.stop()


# -- A6: the API key ------------------------------------------------------------------------

def test_any_authorization_header_and_any_key_compare_without_a_500(one_seat):
    server = one_seat(api_key="sécret")
    for header in (b"Bearer \xe9", "Bearer sécret".encode("latin-1"), b"Bearer \xff\xfe", b""):
        r = httpx.get(server.url + "/v1/models", headers=[(b"authorization", header)])
        assert r.status_code == 401, (header, r.text)
    r = httpx.get(server.url + "/v1/models", headers=[(b"authorization", "Bearer sécret".encode())])
    assert r.status_code == 200


def test_the_key_comes_from_a_file_or_the_environment(tmp_path):
    import argparse

    from tinypaged.cli.commands import api_key

    def args(key=None, key_file=None):
        return argparse.Namespace(api_key=key, api_key_file=key_file)
    key_file = tmp_path / "key"
    key_file.write_text("from-the-file\n")
    assert api_key(args(key_file=str(key_file)), {"TINYPAGED_API_KEY": "env"}) == "from-the-file"
    assert api_key(args(), {"TINYPAGED_API_KEY": "from-env"}) == "from-env"
    assert api_key(args("flag"), {"TINYPAGED_API_KEY": "from-env"}) == "flag"
    assert api_key(args(), {}) is None and api_key(args(), {"TINYPAGED_API_KEY": ""}) is None
    with pytest.raises(ValueError, match="not both"):
        api_key(args("flag", str(key_file)), {})
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(ValueError, match="is empty"):
        api_key(args(key_file=str(tmp_path / "empty")), {})


@pytest.mark.parametrize("host, loopback", [("127.0.0.1", True), ("::1", True),
                                            ("localhost", True), ("0.0.0.0", False),
                                            ("192.168.1.5", False), ("example.com", False)])
def test_only_loopback_hosts_go_without_a_warning(host, loopback):
    from tinypaged.serve.server import is_loopback

    assert is_loopback(host) == loopback


# -- A7: integers bounded where parsed; a failure's cause in the log -------------------------

@pytest.mark.parametrize("field, value", [("top_k", 2**63), ("top_k", 2**64 + 5),
                                          ("max_tokens", 2**70), ("stop_token_ids", [2**63]),
                                          ("best_of", 2**63), ("prompt", [2**63]),
                                          ("prompt", [[1, 2**64]]), ("logit_bias", {"9" * 5000: 1})])
@pytest.mark.parametrize("stream", [False, True])
def test_huge_integers_are_a_400_naming_the_field(one_seat, field, value, stream):
    server = one_seat()
    body = {"prompt": "Once upon a time", "max_tokens": 5, "temperature": 1, field: value,
            "stream": stream}
    error = assert_openai_error(httpx.post(server.url + COMPLETIONS, json=body, timeout=60), 400,
                                field)
    assert len(error["message"]) < 300


def test_an_engine_failure_is_logged_with_its_cause(one_seat, monkeypatch, caplog):
    from tinypaged.engine import step_logits

    server = one_seat()

    def broken(*args):
        raise ValueError("the sampler broke")
    monkeypatch.setattr(step_logits, "sample_tokens", broken)
    with caplog.at_level(logging.ERROR, logger="tinypaged.serve"):
        r = httpx.post(server.url + COMPLETIONS, json={"prompt": "Once", "max_tokens": 3},
                       timeout=60)
        assert assert_openai_error(r, 500)["message"] == "generation failed: the sampler broke"
        streamed = httpx.post(server.url + COMPLETIONS, timeout=60,
                              json={"prompt": "Once", "max_tokens": 3, "stream": True})
        assert "generation failed: the sampler broke" in streamed.text
    failures = [r for r in caplog.records if "failed in the engine" in r.getMessage()]
    assert len(failures) == 2 and all(r.exc_info and "the sampler broke" in r.getMessage()
                                      for r in failures)


# -- A9: errors never echo a client's input whole -------------------------------------------

@pytest.mark.parametrize("method, path, body", [
    ("POST", COMPLETIONS, {"prompt": "x", "model": "m" * (3 << 20)}),
    ("POST", COMPLETIONS, {"prompt": "x", "logit_bias": {"5" * 100_000: 1}}),
    ("POST", COMPLETIONS, {"prompt": "x", "logit_bias": {"x" * 100_000: "y"}}),
    ("GET", "/v1/models/" + "m" * 8000, None),
    ("GET", "/v1/nothing-here-" + "z" * 8000, None),
])
def test_errors_quote_a_long_value_cut_short(one_seat, method, path, body):
    """(A model name is only an error under --strict-model-name.)"""
    server = one_seat(max_body_bytes=8 << 20, strict_model_name=True)
    r = httpx.request(method, server.url + path, json=body, timeout=60)
    assert r.status_code in (400, 404) and len(r.content) < 1500, r.content[:300]
    assert "characters)" in r.json()["error"]["message"] or "..." in r.json()["error"]["message"]


# -- A8: text_offset -------------------------------------------------------------------------

def test_text_offsets_point_into_the_text_streamed_or_not(one_seat):
    server = one_seat()
    body = {"prompt": "Once upon a time", "echo": True, "logprobs": 1, "max_tokens": 12,
            "temperature": 0}
    whole = httpx.post(server.url + COMPLETIONS, json=body, timeout=60).json()["choices"][0]
    text, lp = whole["text"], whole["logprobs"]
    offsets = lp["text_offset"]
    assert lp["tokens"][:5] == ["<s>", " Once", " upon", " a", " time"]
    assert offsets[:6] == [0, 0, 4, 9, 11, 16]  # "<s>" and the leading space take nothing
    assert text.startswith("Once upon a time")
    assert offsets == sorted(offsets) and offsets[-1] < len(text)
    for token, start, end in zip(lp["tokens"][2:], offsets[2:], offsets[3:] + [len(text)]):
        assert text[start:end] == token  # every later token's text, where it says
    r = httpx.post(server.url + COMPLETIONS, json={**body, "stream": True}, timeout=60)
    streamed = [off for event in sse_events(r.text) for choice in event["choices"]
                if choice["logprobs"] for off in choice["logprobs"]["text_offset"]]
    assert streamed == offsets


def test_generated_text_keeps_the_space_its_first_token_opens_with(stories_dir):
    """A SentencePiece word decodes without its leading space when it comes first: the
    first generated token read alone lost it ("...there was a" + "little girl")."""
    with LLM(stories_dir, backend="cpu", kv_cache_memory=4 << 20) as llm:
        prompt = "Once upon a time there was a"
        out = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=6))[0]
        tok = llm.tokenizer
        whole = tok.decode(out.prompt_token_ids + out.outputs[0].token_ids)
        assert out.outputs[0].text.startswith(" ") and whole == prompt + out.outputs[0].text
        assert "".join(llm.stream(prompt, SamplingParams(temperature=0, max_tokens=6))) == \
            out.outputs[0].text
        beam = llm.beam_search(prompt, beam_width=2, max_tokens=4)[0].beams[0]
        assert beam.text.startswith(" ")


# -- A11: the smaller points -----------------------------------------------------------------

def test_null_means_the_default(one_seat):
    server = one_seat()
    body = {"prompt": "Once", "temperature": None, "top_p": None, "n": None, "max_tokens": None,
            "stop": None, "seed": None, "presence_penalty": None, "ignore_eos": True,
            "top_k": None, "logprobs": None, "echo": None}
    r = httpx.post(server.url + COMPLETIONS, json=body, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == 16  # completions' default max_tokens
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)
    out = client.completions.create(model="stories260K", prompt="Once", temperature=None,
                                    max_tokens=3)
    assert out.choices[0].finish_reason in ("stop", "length")


@pytest.mark.parametrize("content_type", [None, "text/plain", "application/x-www-form-urlencoded",
                                          "application/json; charset=utf-8"])
def test_a_json_body_is_read_whatever_content_type_curl_sends(one_seat, content_type):
    server = one_seat()
    headers = {} if content_type is None else {"content-type": content_type}
    r = httpx.post(server.url + COMPLETIONS, headers=headers, timeout=60,
                   content=b'{"prompt": "Once", "max_tokens": 2}')
    assert r.status_code == 200, r.text


def test_x_request_id_is_echoed_and_each_finished_request_logged_once(one_seat, caplog):
    server = one_seat()
    with caplog.at_level(logging.INFO, logger="tinypaged.serve"):
        r = httpx.post(server.url + COMPLETIONS, headers={"X-Request-Id": "trace-42"},
                       json={"prompt": ["Once", "The"], "max_tokens": 3, "ignore_eos": True},
                       timeout=60)
        assert r.status_code == 200 and r.headers["x-request-id"] == "trace-42"
        streamed = httpx.post(server.url + COMPLETIONS, headers={"X-Request-Id": "trace-43"},
                              json={"prompt": "Once", "max_tokens": 2, "stream": True,
                                    "ignore_eos": True}, timeout=60)
        assert streamed.headers["x-request-id"] == "trace-43"
        refused = httpx.post(server.url + COMPLETIONS, json={"prompt": 5})
        assert refused.status_code == 400 and len(refused.headers["x-request-id"]) == 32
    lines = [r.getMessage() for r in caplog.records if r.name == "tinypaged.serve"]
    first = [line for line in lines if "trace-42" in line]
    assert len(first) == 1 and "2 prompts, 4 prompt + 6 completion tokens in" in first[0]
    assert first[0].endswith("finish: length") and r.json()["id"] in first[0]
    assert len([line for line in lines if "trace-43" in line]) == 1


def test_head_health_and_a_content_part_of_another_type(one_seat):
    server = one_seat()
    assert httpx.head(server.url + "/health").status_code == 200
    body = {"messages": [{"role": "user", "content": [
        {"type": "text", "text": "hi"}, {"type": "image_url", "image_url": {"url": "x"}}]}]}
    error = assert_openai_error(httpx.post(server.url + "/v1/chat/completions", json=body), 400,
                                "messages")
    assert "part 1 is of type 'image_url'; this server takes only 'text' parts" in error["message"]


def test_the_api_docs_still_describe_the_request_bodies(one_seat):
    spec = httpx.get(one_seat().url + "/openapi.json").json()
    schemas = spec["components"]["schemas"]
    body = spec["paths"]["/v1/completions"]["post"]["requestBody"]["content"]["application/json"]
    assert body["schema"] == {"$ref": "#/components/schemas/CompletionRequest"}
    assert {"prompt", "max_tokens", "logprobs"} <= set(schemas["CompletionRequest"]["properties"])
    refs = set()

    def walk(node):
        if isinstance(node, dict):
            refs.update(v for k, v in node.items() if k == "$ref")
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)
    walk(spec)
    assert refs and all(ref.rsplit("/", 1)[1] in schemas for ref in refs)
