"""`cli.py serve` as a process: SIGTERM or SIGINT ends it cleanly, with exit status 0,
in-flight requests finished (within the grace period) or aborted (after it), and
either way their clients get a whole response."""
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
pytestmark = pytest.mark.slow  # SmolLM2 decodes slowly enough to be caught mid-stream


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
    """A streaming completion read in a thread: (thread, lines read, first line seen)."""
    lines, first = [], threading.Event()

    def read():
        body = {"prompt": "Once upon a time", "max_tokens": max_tokens, "ignore_eos": True,
                "stream": True, "temperature": 0}
        try:
            with httpx.stream("POST", url + "/v1/completions", json=body, timeout=60) as r:
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
    proc, url = start_server(smollm2_dir, "--shutdown-timeout", "60")
    thread, lines, first = stream_in_background(url, max_tokens=40)
    assert first.wait(60)
    proc.send_signal(sig)
    thread.join(60)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert lines[-1] == "data: [DONE]"  # the request was finished, not cut
    assert "Traceback" not in err and "server stopped" in err


def test_streams_past_the_grace_period_are_aborted(smollm2_dir):
    proc, url = start_server(smollm2_dir, "--shutdown-timeout", "1")
    thread, lines, first = stream_in_background(url, max_tokens=1000)  # ~10 s of decoding
    assert first.wait(60)
    proc.send_signal(signal.SIGTERM)
    thread.join(60)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert lines[-1] == "data: [DONE]" and len(lines) < 1000  # a whole response, cut short
    assert json.loads(lines[-2][len("data: "):])["choices"][0]["finish_reason"] == "abort"
    assert "Traceback" not in err and "ERROR" not in err
