"""Hostile and careless requests against `cli.py serve`, one at a time, and what a
plain client beside each one sees (issue 31, parts 4 and 5).

Starts the server as a process with the default model (SmolLM2-135M-Instruct, whose
49,152-token vocabulary makes grammars cost what they cost in use). A plain client
(a thread sending an 8-token completion as soon as its last one ends, and another
asking /health) runs throughout. First a baseline with no probe; then each probe is
sent, `--repeat` times in a row, while the plain clients go on. Per probe: its HTTP
status, the longest time it took, its error body's length and first words, the
server's RSS growth over the probe (its VmHWM, the peak, against the start), and the
plain client's p50/p99 latency and /health's worst over the same span, with the
p99's ratio to the baseline's. Target: a clear 4xx (or a 200) within the budget,
memory bounded, the plain p99 within 2x the baseline. Prints figures; asserts nothing.

Usage: python bench/serve_probes.py [--model PATH] [--repeat 3] [--baseline-seconds 8]
                                    [--probes name,name]
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

import numpy as np

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
CHAT, COMPLETIONS, TOKENIZE = "/v1/chat/completions", "/v1/completions", "/tokenize"
USER = [{"role": "user", "content": "Give me JSON."}]


def probes() -> dict[str, tuple[str, dict]]:
    """name -> (route, body): the issue's probes, each the worst of its kind."""
    many = {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(10_000)}}
    strings = {"type": "object", "properties": {f"a_longer_property_name_{i}": {"type": "string"}
                                                for i in range(500)}}
    endless = {"$ref": "#/$defs/A", "$defs": {"A": {"type": "object", "properties": {
        "a": {"$ref": "#/$defs/A"}}, "required": ["a"]}}}
    pattern_tool = {"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"x": {"type": "string", "pattern": "^(a{1000}){1000}$"}},
        "required": ["x"]}}}
    wrong_role = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i}"}
                  for i in range(3000)] + [{"role": "bogus", "content": "x"}]
    template_text = "The quick brown fox jumps over the lazy dog. " * 90_000  # ~4 MB
    chat = {"messages": USER, "max_tokens": 16}
    return {
        "schema-10k-optional": (CHAT, {**chat, "response_format": {
            "type": "json_schema", "json_schema": {"name": "x", "schema": many}}}),
        "schema-500-strings": (CHAT, {**chat, "response_format": {
            "type": "json_schema", "json_schema": {"name": "x", "schema": strings}}}),
        "schema-no-finite": (CHAT, {**chat, "response_format": {
            "type": "json_schema", "json_schema": {"name": "x", "schema": endless}}}),
        "regex-1000x1000": (COMPLETIONS, {"prompt": "Say a:", "max_tokens": 16,
                                          "guided_regex": "(a{1000}){1000}"}),
        "regex-a1e6": (COMPLETIONS, {"prompt": "Say a:", "max_tokens": 16,
                                     "guided_regex": "a{1000000}"}),
        "tool-pattern": (CHAT, {**chat, "tools": [pattern_tool], "tool_choice": "required"}),
        "tokenize-4MB": (TOKENIZE, {"prompt": template_text[:4_000_000 - 200]}),
        "chat-3000-turns-bad-role": (CHAT, {"messages": wrong_role, "max_tokens": 4}),
        "template-3000-turns": (TOKENIZE, {"messages": wrong_role[:-1]}),
    }


def request(url: str, body: dict | None, timeout: float = 600) -> tuple[int, bytes]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data, {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


class PlainClients:
    """One thread of 8-token completions, one of /health, back to back; latencies kept
    with their start times."""

    def __init__(self, base: str):
        self.base, self.stop = base, threading.Event()
        self.completions: list[tuple[float, float, int]] = []
        self.health: list[tuple[float, float, int]] = []
        self.threads = [threading.Thread(target=self._run, args=(self.completions, COMPLETIONS,
                                                                 {"prompt": "Once upon a time",
                                                                  "max_tokens": 8})),
                        threading.Thread(target=self._run, args=(self.health, "/health", None))]
        for t in self.threads:
            t.start()

    def _run(self, out, route, body):
        while not self.stop.is_set():
            start = time.monotonic()
            status, _ = request(self.base + route, body, timeout=120)
            out.append((start, time.monotonic() - start, status))
            if body is None:
                time.sleep(0.02)

    def between(self, out, t0: float, t1: float) -> np.ndarray:
        return np.array([d for s, d, _ in out if t0 <= s <= t1]) * 1000

    def close(self):
        self.stop.set()
        for t in self.threads:
            t.join()


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def settle(pid: int, busy_share: float, timeout: float = 120.0) -> float:
    """Wait until the server uses at most busy_share of a core more than with the plain
    clients alone (a probe's work cut off at its budget runs on in its thread); the
    seconds waited."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        before = cpu_seconds(pid)
        time.sleep(0.5)
        if (cpu_seconds(pid) - before) / 0.5 <= busy_share:
            break
    return time.monotonic() - start


def rss_mb(pid: int, field: str = "VmRSS") -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return float("nan")


def reset_peak(pid: int) -> None:
    """Start VmHWM again from now (Linux: writing 5 to clear_refs)."""
    try:
        with open(f"/proc/{pid}/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--baseline-seconds", type=float, default=8.0)
    ap.add_argument("--probes", default=None)
    args = ap.parse_args()
    chosen = probes()
    if args.probes:
        chosen = {k: chosen[k] for k in args.probes.split(",")}
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    cmd = [sys.executable, os.path.join(ROOT, "cli.py"), "serve", "--port", str(port)]
    if args.model:
        cmd += ["--model", args.model]
    log = tempfile.NamedTemporaryFile("w", prefix="serve_probes-", suffix=".log", delete=False)
    print(f"server log: {log.name}")  # (a pipe nobody reads would fill and stall the server)
    server = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 600
        while True:
            try:
                if request(base + "/health", None, timeout=5)[0] == 200:
                    break
            except OSError:
                pass
            assert server.poll() is None and time.monotonic() < deadline, "server did not start"
            time.sleep(0.2)
        plain = PlainClients(base)
        t0 = time.monotonic()
        time.sleep(args.baseline_seconds)
        base_cpu = cpu_seconds(server.pid)
        time.sleep(args.baseline_seconds)
        base_share = (cpu_seconds(server.pid) - base_cpu) / args.baseline_seconds
        base_lat = plain.between(plain.completions, t0, time.monotonic())
        base_p99 = float(np.percentile(base_lat, 99))
        print(f"baseline: plain completions p50 {np.percentile(base_lat, 50):.0f} ms, "
              f"p99 {base_p99:.0f} ms over {len(base_lat)}; RSS {rss_mb(server.pid):.0f} MB")
        print(f"(the server uses {base_share:.0%} of a core for the plain clients)")
        print(f"{'probe':26} {'status':>6} {'worst s':>8} {'body':>5} {'+peak MB':>8} "
              f"{'p50 ms':>7} {'p99 ms':>7} {'x base':>6} {'health max':>10} {'tail':>5}  first words")
        for name, (route, body) in chosen.items():
            settle(server.pid, base_share + 0.25)
            start_rss = rss_mb(server.pid)
            reset_peak(server.pid)
            t0 = time.monotonic()
            worst, statuses, answer = 0.0, [], b""
            for _ in range(args.repeat):
                s = time.monotonic()
                status, answer = request(base + route, body)
                worst = max(worst, time.monotonic() - s)
                statuses.append(status)
            time.sleep(max(0.0, 1.0 - (time.monotonic() - t0)))  # at least a second of plain
            t1 = time.monotonic()
            lat = plain.between(plain.completions, t0, t1)
            health = plain.between(plain.health, t0, t1)
            p99 = float(np.percentile(lat, 99)) if len(lat) else float("nan")
            words = ""
            try:
                words = json.loads(answer)["error"]["message"][:60]
            except (ValueError, KeyError, TypeError):
                words = answer[:60].decode("utf-8", "replace")
            peak = rss_mb(server.pid, "VmHWM") - start_rss
            tail = settle(server.pid, base_share + 0.25)
            print(f"{name:26} {'/'.join(map(str, sorted(set(statuses)))):>6} {worst:8.2f} "
                  f"{len(answer):5d} {peak:8.0f} {np.percentile(lat, 50) if len(lat) else 0:7.0f} "
                  f"{p99:7.0f} {p99 / base_p99:6.2f} {health.max() if len(health) else 0:10.0f} "
                  f"{tail:5.1f}  {words!r}")
        plain.close()
        print(f"RSS at the end {rss_mb(server.pid):.0f} MB")
    finally:
        server.terminate()
        server.wait(30)


if __name__ == "__main__":
    main()
