"""Nothing a request asks the server to build stalls the others (issue 31, part 4):
templates, tokenizing and grammars run in worker threads while /health and other
clients are served; a job past its budget is a 400, a pool with every thread taken a
503; a grammar over llguidance's limits is a short 400 naming the limit, at compile
time or at a later token, and the same grammar is refused at once next time; the
compiled grammars' cache is bounded in bytes."""
import asyncio
import os
import threading

import httpx
import pytest

from serving import ServerThread, sse_events, wait_until
from tinypaged import LLM
from tinypaged.serve.errors import MAX_MESSAGE_CHARS, APIError
from tinypaged.serve.workers import WorkerPool
from tinypaged.structured import StructuredOutputs
from tinypaged.structured.grammar import Grammars

COMPLETIONS = "/v1/completions"
# compiles (no token is forced at the start); the token after the first asks for 10**6 states
LATE_EXPLOSION = "(b|c)(a{1000}){1000}"


@pytest.fixture(scope="module")
def server(stories_dir):
    llm = LLM(stories_dir, backend="cpu", kv_cache_memory=16 << 20)
    server = ServerThread(llm, work_budget=60.0)
    yield server
    server.stop()
    llm.close()


def test_held_work_leaves_health_and_other_clients_served(server, monkeypatch):
    text, entered, release = server.server.config.app.state.engine_client.text, \
        threading.Event(), threading.Event()
    real = text.encode
    threads = []

    def held(prompt, add_special_tokens=True, **options):  # (tokenizing a long prompt, say)
        if prompt == "hold":
            threads.append(threading.get_ident())
            entered.set()
            assert release.wait(120)
        return real(prompt, add_special_tokens, **options)
    monkeypatch.setattr(text, "encode", held)
    results = []
    waiter = threading.Thread(target=lambda: results.append(httpx.post(
        server.url + COMPLETIONS, json={"prompt": "hold", "max_tokens": 4}, timeout=120)))
    waiter.start()
    try:
        assert entered.wait(120)
        assert httpx.get(server.url + "/health", timeout=60).status_code == 200
        other = httpx.post(server.url + COMPLETIONS, json={"prompt": "Once", "max_tokens": 4},
                           timeout=60)
        assert other.status_code == 200
    finally:
        release.set()
        waiter.join(120)
    assert results[0].status_code == 200 and threads[0] != server.thread.ident


def test_large_text_work_runs_in_a_child_process(server):
    """A long prompt is tokenized, a long token list decoded, in a text worker process
    (text_processes.py): the same ids and text as the model's tokenizer."""
    text = "Once upon a time, there was a little girl. " * 400  # over INLINE_CHARS
    ids = server.llm.tokenizer.encode(text)
    r = httpx.post(server.url + "/tokenize", json={"prompt": text}, timeout=120)
    assert r.status_code == 200 and r.json()["tokens"] == ids
    r = httpx.post(server.url + "/detokenize", json={"tokens": ids}, timeout=120)
    assert r.status_code == 200 and r.json()["prompt"] == server.llm.tokenizer.decode(ids)
    r = httpx.post(server.url + COMPLETIONS, json={"prompt": text, "max_tokens": 1}, timeout=120)
    # (refused from its size, before any tokenizing: Tokenizer.check_fits)
    assert r.status_code == 400 and "prompt has at least" in r.json()["error"]["message"]
    work = server.server.config.app.state.engine_client.text
    child = work._idle.get_nowait()
    work._idle.put(child)
    assert child.process.is_alive() and child.process.pid != os.getpid()


def test_a_job_past_its_budget_is_a_400_and_a_full_pool_a_503():
    async def scenario():
        pool = WorkerPool("test", 1, budget=0.05, queue_timeout=0.05)
        release = threading.Event()
        try:
            with pytest.raises(APIError) as slow:
                await pool.run(lambda: release.wait(120), "holding on", "messages")
            assert slow.value.status == 400 and slow.value.param == "messages"
            assert "holding on took more than 0.05 s" in slow.value.message
            with pytest.raises(APIError) as busy:  # the one thread is still held
                await pool.run(lambda: 1, "adding")
            assert busy.value.status == 503 and busy.value.headers == {"Retry-After": "1"}
        finally:
            release.set()
        pool.budget = pool.queue_timeout = 120
        assert await pool.run(lambda: 41 + 1, "adding") == 42
        pool.close()
    asyncio.run(scenario())


@pytest.mark.parametrize("constraint", [
    {"guided_regex": "(a{1000}){1000}"},  # goes over at compile time
    {"guided_regex": LATE_EXPLOSION},  # at the second token
    {"guided_regex": "b(a{1000}){1000}"},  # after its forced "b": found while compiling
    {"guided_json": {"$ref": "#/$defs/A", "$defs": {"A": {  # no finite instance
        "type": "object", "properties": {"a": {"$ref": "#/$defs/A"}}, "required": ["a"]}}}},
    {"guided_json": {"type": "object",  # refused before compiling (it took 11 s to fail)
                     "properties": {f"p{i}": {"type": "string"} for i in range(10_000)}}},
])
def test_a_grammar_over_a_limit_is_a_short_400_naming_it(server, constraint):
    field = next(iter(constraint))
    for _ in range(2):  # and the second time, from the cache
        r = httpx.post(server.url + COMPLETIONS, timeout=120,
                       json={"prompt": "Once", "max_tokens": 8, **constraint})
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert error["param"] == field and error["message"].startswith(f"{field}: ")
        assert "llguidance's limit" in error["message"] and len(r.text) < MAX_MESSAGE_CHARS + 200
        assert "\n" not in error["message"] and "Parser: {" not in error["message"]
    if "optional properties" not in error["message"]:  # (that one never compiles)
        kept = [c for c in server.llm.engine.grammars._compiled.values() if c.failure]
        assert any(error["message"].endswith(c.failure.split(": ", 2)[2]) for c in kept)
        assert all(c.prototype is None for c in kept)  # the matcher let go
    assert server.llm.stats()["blocks_used"] == 0


def test_a_grammar_that_fails_mid_stream_says_so_in_the_stream(server):
    r = httpx.post(server.url + COMPLETIONS, timeout=120, json={
        "prompt": "Once", "max_tokens": 8, "stream": True, "guided_regex": "(d|e)" + LATE_EXPLOSION})
    events = sse_events(r.text)
    error = events[-1]["error"]
    assert error["type"] == "invalid_request_error" and "initial_lexer_fuel" in error["message"]
    ok = httpx.post(server.url + COMPLETIONS, json={"prompt": "Once", "max_tokens": 4}, timeout=60)
    assert ok.status_code == 200
    # the same explosion behind a forced start is found while compiling: a 400, no stream
    r = httpx.post(server.url + COMPLETIONS, timeout=120, json={
        "prompt": "Once", "max_tokens": 8, "stream": True, "guided_regex": "db(a{1000}){1000}"})
    assert r.status_code == 400 and "initial_lexer_fuel" in r.json()["error"]["message"]
    wait_until(lambda: server.llm.stats()["blocks_used"] == 0, what="blocks freed", timeout=60)


def test_the_compiled_grammars_are_bounded_in_bytes(stories_dir):
    llm = LLM(stories_dir, backend="cpu", kv_cache_memory=4 << 20)
    try:
        grammars = Grammars(llm.tokenizer, llm.config.vocab_size, [2], cache_bytes=8 << 10)
        first = StructuredOutputs(regex="a{1,10}")
        grammars.compile(first)
        for n in range(200):
            grammars.compile(StructuredOutputs(regex=f"(once|upon|a|time){{{n + 1}}}"))
            assert grammars.cached_bytes <= 8 << 10 or len(grammars._compiled) == 1
        assert first.text not in grammars._compiled  # the least recently used went first
    finally:
        llm.close()
