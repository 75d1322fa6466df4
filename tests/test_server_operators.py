"""What an operator sees: every refusal (4xx) as one log line with the request id and
the reason, and /health saying "loading" until the warm-up request has run."""
import logging
import threading

import httpx
import pytest
from fastapi.testclient import TestClient

from serving import ServerThread
from tinypaged import LLM
from tinypaged.serve.app import build_app
from tinypaged.serve.config import ServerConfig
from tinypaged.serve.warmup import start_warm_up


@pytest.fixture(scope="module")
def llm(stories_dir):
    return LLM(stories_dir)


def test_each_refusal_is_one_log_line_with_its_request_id_and_reason(llm, caplog):
    server = ServerThread(llm, api_key="sekrit")
    try:
        with caplog.at_level(logging.WARNING, logger="tinypaged.serve"):
            bad = httpx.post(server.url + "/v1/completions", headers={
                "Authorization": "Bearer sekrit", "X-Request-Id": "probe-1"},
                json={"model": "m", "prompt": "hi", "temperature": 5.0})
            unauthorized = httpx.post(server.url + "/v1/completions", headers={"X-Request-Id": "probe-2"},
                                      json={"model": "m", "prompt": "hi"})
            missing = httpx.get(server.url + "/nowhere", headers={"X-Request-Id": "probe-3"})
        assert (bad.status_code, unauthorized.status_code, missing.status_code) == (400, 401, 404)
        lines = [r.getMessage() for r in caplog.records if r.name == "tinypaged.serve"]
        for probe, status, reason in (("probe-1", 400, bad.json()["error"]["message"]),
                                      ("probe-2", 401, "invalid or missing API key"),
                                      ("probe-3", 404, "no route GET")):
            mine = [line for line in lines if f"request {probe}:" in line]
            assert len(mine) == 1 and f"-> {status}:" in mine[0] and reason in mine[0], lines
            assert "\n" not in mine[0]
        assert "temperature" in bad.json()["error"]["message"]
    finally:
        server.stop()


def test_health_says_loading_until_the_warm_up_ends(llm):
    ready = threading.Event()
    client = TestClient(build_app(llm, ServerConfig(), ready))
    assert client.get("/health").status_code == 503
    assert client.get("/health").json() == {"status": "loading"}
    start_warm_up(llm, ready).join(timeout=300)
    assert ready.is_set()
    assert client.get("/health").status_code == 200 and client.get("/health").json() == {"status": "ok"}


def test_a_failed_warm_up_is_logged_and_still_ends_the_loading(llm, caplog, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("the kernels could not be compiled\nsecond line")
    monkeypatch.setattr(llm, "generate", broken)
    ready = threading.Event()
    with caplog.at_level(logging.ERROR, logger="tinypaged.serve"):
        start_warm_up(llm, ready).join(timeout=60)
    assert ready.is_set()
    lines = [r.getMessage() for r in caplog.records if r.name == "tinypaged.serve"]
    assert any("warm-up failed" in line and "could not be compiled" in line
               and "second line" not in line for line in lines), lines
