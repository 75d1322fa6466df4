"""`cli.py serve` as a process: SIGTERM or SIGINT ends it cleanly, with exit status 0,
in-flight requests finished (within the grace period) or aborted (after it), and
either way their clients get a whole response.

A request is in flight when its first token has streamed back; the signal follows
that event at once, while the request still has hundreds of tokens to go (the
signal takes milliseconds, each token a forward pass): no test needs the model to
decode slowly, or fast."""
import json
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest

from serving import wait_until

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow  # (SmolLM2, pulled on first use)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(model_dir, *extra) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, str(ROOT / "cli.py"), "serve", "--model", str(model_dir),
                             "--port", str(port), "--kv-cache-memory", "64M", "--backend", "cpu",
                             *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"

    def healthy():
        assert proc.poll() is None, proc.communicate()[1]
        try:
            return httpx.get(url + "/health", timeout=1).status_code == 200
        except httpx.TransportError:
            return False
    wait_until(healthy, timeout=300, what="the server")  # (a bound for a failure)
    return proc, url


def stream_in_background(url: str, max_tokens: int) -> tuple[threading.Thread, list, threading.Event]:
    """A streaming completion read in a thread: (thread, lines read, first line seen).
    Its first line is a token's (the prompt is not echoed)."""
    lines, first = [], threading.Event()

    def read():
        body = {"prompt": "Once upon a time", "max_tokens": max_tokens, "ignore_eos": True,
                "stream": True, "temperature": 0}
        try:
            with httpx.stream("POST", url + "/v1/completions", json=body, timeout=300) as r:
                for line in r.iter_lines():
                    if line:  # events are separated by blank lines
                        lines.append(line)
                        first.set()
        except httpx.HTTPError as e:  # the server cut it off: that is one of the two outcomes
            lines.append(f"cut: {type(e).__name__}")
        first.set()
    thread = threading.Thread(target=read)
    thread.start()
    return thread, lines, first


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_in_flight_streams_finish_within_the_grace_period(smollm2_dir, sig):
    """A grace period no run of 200 tokens comes near (a bound for a failure)."""
    proc, url = start_server(smollm2_dir, "--shutdown-timeout", "300")
    thread, lines, first = stream_in_background(url, max_tokens=200)
    assert first.wait(60)
    seen = len(lines)  # (the signal is sent with ~199 tokens still to come)
    proc.send_signal(sig)
    thread.join(300)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert lines[-1] == "data: [DONE]"  # the request was finished, not cut
    assert len(lines) > seen + 100  # ...after the signal
    assert json.loads(lines[-2][len("data: "):])["choices"][0]["finish_reason"] == "length"
    assert "Traceback" not in err and "server stopped" in err


def test_streams_past_the_grace_period_are_aborted(smollm2_dir):
    """No grace at all: what is in flight at the signal is aborted at once."""
    proc, url = start_server(smollm2_dir, "--shutdown-timeout", "0")
    thread, lines, first = stream_in_background(url, max_tokens=1000)
    assert first.wait(60)
    proc.send_signal(signal.SIGTERM)
    thread.join(60)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert lines[-1] == "data: [DONE]" and len(lines) < 900  # a whole response, cut short
    assert json.loads(lines[-2][len("data: "):])["choices"][0]["finish_reason"] == "abort"
    assert "Traceback" not in err and "ERROR" not in err
