"""One abusive client against `cli.py serve`, and what the others see (issue 18, A1-A3).

Starts the server as a process (stories260K on the CPU: the engine is fast, so the
server's own bookkeeping shows) with its default limits. Well-behaved clients
(threads, each sending a small completion, 8 tokens, as soon as its last one ends)
run throughout; each phase adds one abusive client, in a process of its own, for
`--seconds`, sending its request once every `--every` seconds:
  baseline    nobody else;
  A1          the issue's reproducer: 20,000 prompts in one request;
  A1-limit    the largest batch allowed: 256 prompts x 16 tokens;
  A2          20,000 idle sockets opened as fast as one client can (the default
              --max-connections is 1024: each new one replaces the idlest): a
              connection flood, measured while it runs;
  A2-held     the issue's reproducer: the 20,000 sockets opened first, then held
              idle while the good clients run;
  A3          the reproducer: echo + logprobs 20 over 800 prompts of 501 ids (1.9 MB);
  A3-limit    echo + logprobs 20 over 256 prompts of 32 ids + 16 tokens: 258,048
              entries, just under the default --max-logprob-entries (262,144).
Per phase: the good clients' p50/p99 latency and their count of non-200 answers,
/health's worst latency, the abuser's answers, the server's RSS (before, peak
during, after) and the time to drain (until /metrics shows nothing running or
waiting once the abuser stops), and the server's CPU use (its process's CPU
seconds over the phase's wall time: 100% is one core; the abuser's is among its
answers). Target: good p99 within 2x the baseline's and no
503 to a good client. Prints figures; asserts nothing.

Usage: python bench/serve_abuse.py [--seconds 6] [--every 1] [--good 4] [--sockets 20000]
                                 [--phases baseline,A2,...]
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import resource
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import numpy as np

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
STORIES = os.path.join(ROOT, "tests", "models", "stories260K")


def post(url: str, body: dict, timeout: float = 600) -> int:
    request = urllib.request.Request(url, json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as r:
            r.read()
            return r.status
    except urllib.error.HTTPError as e:
        e.read()
        return e.code
    except OSError:
        return -1  # refused or reset


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process pid, from /proc."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def gauges(base: str) -> tuple[float, float]:
    with urllib.request.urlopen(base + "/metrics", timeout=60) as r:
        text = r.read().decode()
    values = {}
    for line in text.splitlines():
        if line.startswith(("vllm:num_requests_running", "vllm:num_requests_waiting")):
            name, value = line.rsplit(" ", 1)
            values[name.split("{")[0]] = float(value)
    return values["vllm:num_requests_running"], values["vllm:num_requests_waiting"]


class Phase:
    """Good clients, a /health prober and an RSS sampler, while an abuser runs."""

    def __init__(self, base: str, pid: int, good: int):
        self.base, self.pid, self.good = base, pid, good
        self.latencies: list[float] = []
        self.bad_answers: dict[int, int] = {}
        self.health: list[float] = []
        self.rss_peak = 0.0
        self.stop = threading.Event()

    def good_client(self) -> None:
        body = {"prompt": "Once upon a time", "max_tokens": 8, "temperature": 0, "ignore_eos": True}
        while not self.stop.is_set():
            start = time.perf_counter()
            status = post(self.base + "/v1/completions", body)
            self.latencies.append(time.perf_counter() - start)
            if status != 200:
                self.bad_answers[status] = self.bad_answers.get(status, 0) + 1

    def prober(self) -> None:
        while not self.stop.is_set():
            start = time.perf_counter()
            try:
                urllib.request.urlopen(self.base + "/health", timeout=60).read()
            except OSError:
                pass
            self.health.append(time.perf_counter() - start)
            self.rss_peak = max(self.rss_peak, rss_mb(self.pid))
            self.stop.wait(0.05)

    def run(self, abuse, seconds: float, every: float) -> dict:
        rss_before = rss_mb(self.pid)
        threads = [threading.Thread(target=self.good_client) for _ in range(self.good)]
        threads.append(threading.Thread(target=self.prober))
        stop, ready = multiprocessing.Event(), multiprocessing.Event()
        answers = multiprocessing.Queue()
        abuser = multiprocessing.Process(target=run_abuser, args=(abuse, self.base, stop, ready,
                                                                  every, answers)) if abuse else None
        if abuser:
            abuser.start()
            ready.wait(600)  # an abuser that sets itself up first (A2-held)
        watched = [self.pid] + ([abuser.pid] if abuser else [])
        cpu_start, wall_start = [cpu_seconds(p) for p in watched], time.perf_counter()
        for t in threads:
            t.start()
        time.sleep(seconds)
        wall = time.perf_counter() - wall_start
        cpu = [(cpu_seconds(p) - c) / wall for p, c in zip(watched, cpu_start)]
        self.stop.set()
        stop.set()
        abuser_answers = answers.get() if abuser else {}
        if abuser:
            abuser_answers["CPU"] = f"{cpu[1]:.0%}"
        if abuser:
            abuser.join()
        stopped = time.perf_counter()
        while gauges(self.base) != (0.0, 0.0):
            time.sleep(0.01)
        drain = time.perf_counter() - stopped
        for t in threads:
            t.join()
        lat = np.array(self.latencies) * 1e3
        return {"n": len(lat), "p50": float(np.percentile(lat, 50)),
                "p99": float(np.percentile(lat, 99)), "bad": dict(self.bad_answers),
                "health_max": max(self.health) * 1e3, "abuser": abuser_answers,
                "rss": (rss_before, self.rss_peak, rss_mb(self.pid)), "drain": drain,
                "cpu": cpu[0]}


def count(answers: dict, status) -> None:
    answers[status] = answers.get(status, 0) + 1


def run_abuser(abuse, base: str, stop, ready, every: float, results) -> None:
    """In the abuser's process: abuse until stopped; the answers go back on results."""
    answers: dict = {}
    abuse(base, stop, ready, every, answers)
    results.put(answers)


class Repeat:
    """An abuser that posts body once every `every` seconds."""

    def __init__(self, body: dict):
        self.body = body

    def __call__(self, base, stop, ready, every, answers):
        ready.set()
        while not stop.is_set():
            start = time.perf_counter()
            count(answers, post(base + "/v1/completions", self.body))
            stop.wait(max(0.0, every - (time.perf_counter() - start)))


A1 = {"prompt": [[1]] * 20000, "max_tokens": 16, "ignore_eos": True}
A1_LIMIT = {"prompt": [[1, 5 + i] for i in range(256)], "max_tokens": 16, "ignore_eos": True}
A3 = {"prompt": [[1] + [5] * 500] * 800, "echo": True, "logprobs": 20, "max_tokens": 1}
A3_LIMIT = {"prompt": [[1] + [5 + i % 200] * 31 for i in range(256)], "echo": True,
            "logprobs": 20, "max_tokens": 16}


class IdleSockets:
    """An abuser that opens n sockets and sends nothing (a class: it crosses processes):
    while the good clients run, or first (held)."""

    def __init__(self, n: int, held: bool = False):
        self.n, self.held = n, held

    def __call__(self, base, stop, ready, every, answers):
        n = self.n
        if not self.held:
            ready.set()
        port = int(base.rsplit(":", 1)[1])
        held = []
        resource.setrlimit(resource.RLIMIT_NOFILE, (resource.getrlimit(resource.RLIMIT_NOFILE)[1],) * 2)
        for _ in range(n):
            if stop.is_set():
                break
            try:
                held.append(socket.create_connection(("127.0.0.1", port), timeout=5))
            except OSError as e:
                count(answers, type(e).__name__)
                stop.wait(0.01)
        answers["opened"] = len(held)
        ready.set()
        stop.wait()
        closed_by_server = 0
        for sock in held:
            sock.setblocking(False)
            try:
                closed_by_server += sock.recv(1) == b""
            except (BlockingIOError, OSError):
                pass
            sock.close()
        answers["closed by the server"] = closed_by_server


def start_server(port: int) -> subprocess.Popen:
    server = subprocess.Popen([sys.executable, os.path.join(ROOT, "cli.py"), "serve", "--model",
                               STORIES, "--backend", "cpu", "--port", str(port),
                               "--kv-cache-memory", "64M"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    for line in server.stderr:
        if "serving on" in line:
            threading.Thread(target=lambda: [None for _ in server.stderr], daemon=True).start()
            return server
    raise RuntimeError("the server did not start")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--every", type=float, default=1.0,
                        help="seconds between an abuser's requests")
    parser.add_argument("--good", type=int, default=4, help="well-behaved clients")
    parser.add_argument("--sockets", type=int, default=20000, help="A2's idle sockets")
    parser.add_argument("--phases", default="baseline,A1,A1-limit,A2,A2-held,A3,A3-limit",
                        help="which phases to run, comma-separated (baseline always runs first)")
    args = parser.parse_args()
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = start_server(port)
    base = f"http://127.0.0.1:{port}"
    phases = [("baseline", None), ("A1", Repeat(A1)), ("A1-limit", Repeat(A1_LIMIT)),
              ("A2", IdleSockets(min(args.sockets, hard - 200))),
              ("A2-held", IdleSockets(min(args.sockets, hard - 200), held=True)), ("A3", Repeat(A3)),
              ("A3-limit", Repeat(A3_LIMIT))]
    chosen = set(args.phases.split(",")) | {"baseline"}
    phases = [(name, abuse) for name, abuse in phases if name in chosen]
    try:
        post(base + "/v1/completions", {"prompt": "Once", "max_tokens": 2})  # warm
        print(f"{'phase':<9} {'good':>5} {'p50 ms':>8} {'p99 ms':>8} {'x base':>7} {'non-200':>8} "
              f"{'health max':>10} {'RSS MB before/peak/after':>25} {'drain s':>8} {'CPU':>5}  "
              f"abuser's answers")
        base_p99 = None
        for name, abuse in phases:
            r = Phase(base, server.pid, args.good).run(abuse, args.seconds, args.every)
            base_p99 = base_p99 or r["p99"]
            rss = "/".join(f"{v:.0f}" for v in r["rss"])
            print(f"{name:<9} {r['n']:>5} {r['p50']:>8.1f} {r['p99']:>8.1f} "
                  f"{r['p99'] / base_p99:>7.2f} {sum(r['bad'].values()):>8} "
                  f"{r['health_max']:>9.0f}ms {rss:>25} {r['drain']:>8.2f} {r['cpu']:>5.0%}  "
                  f"{r['abuser']}",
                  flush=True)
    finally:
        server.terminate()
        server.wait(timeout=60)


if __name__ == "__main__":
    main()
