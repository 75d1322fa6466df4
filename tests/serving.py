"""Test helpers for the HTTP server: run it in a thread on a free port; read SSE."""
from __future__ import annotations

import json
import socket
import threading
import time

import openai

from tinypaged import LLM
from tinypaged.serve.config import ServerConfig
from tinypaged.serve.server import make_server


class ServerThread:
    """The real uvicorn server over an LLM, on 127.0.0.1 and a free port."""

    def __init__(self, llm, **config):
        self.llm = llm
        self.server = make_server(llm, ServerConfig(port=0, **config), log_level="warning")
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]},
                                       daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 120  # (a bound for a failure: a busy machine is slow)
        while not self.server.started:
            assert self.thread.is_alive() and time.monotonic() < deadline, "server did not start"
            time.sleep(0.01)
        # (a bound for a failure: a warm-up on a cold kernel cache and a busy machine compiles)
        assert self.server.ready.wait(timeout=600), "the server's warm-up did not end"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)
        self.sock.close()


def sse_events(raw: str) -> list:
    """The payloads of a text/event-stream body, checking its framing on the way:
    every event is one `data: ...` line followed by a blank line; the last is [DONE]."""
    assert raw.endswith("data: [DONE]\n\n"), raw[-200:]
    events = raw.split("\n\n")[:-1]
    payloads = []
    for ev in events:
        assert ev.startswith("data: ") and "\n" not in ev, ev
        body = ev[len("data: "):]
        payloads.append(body if body == "[DONE]" else json.loads(body))
    assert payloads[-1] == "[DONE]" and "[DONE]" not in payloads[:-1]
    return payloads[:-1]


def wait_until(condition, timeout: float = 120.0, what: str = "condition") -> None:
    """Poll condition until it holds; the timeout only bounds a failure (generous: CI
    may run beside other work)."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def running_server(model_dir, **config):
    """For a module fixture: stories260K (or another model) served for the module."""
    llm = LLM(model_dir, backend="cpu", kv_cache_memory=16 << 20)
    server = ServerThread(llm, **config)
    yield server
    server.stop()
    llm.close()


def running_tiny_chat_server(folder, **config):
    """For a module fixture: a tiny random model with a byte-level tokenizer and a
    ChatML template, written to folder and served (its name: the folder's)."""
    from helpers import write_tiny_model

    write_tiny_model(str(folder), seed=3, max_position_embeddings=512)
    llm = LLM(folder, backend="cpu", block_size=4, num_blocks=800)
    server = ServerThread(llm, **config)
    yield server
    server.stop()
    llm.close()


def client_for(server: ServerThread, api_key: str = "unused") -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key=api_key, max_retries=0)

