"""Load on `cli.py serve`: concurrent streaming chat clients against the same requests
sent one at a time, in the same run, through the official `openai` async client.

Starts the server as a process (SmolLM2 by default) and runs a fixed list of
clients x per-client chat requests of mixed prompt and output lengths:
  1. one at a time: every request in turn (the baseline);
  2. concurrent: `clients` streaming clients, each sending its next request as soon
     as its last one ends (a closed loop, as load testers run), over the same list;
  3. burst: one request per client, all at once (the tail of the longest request
     dominates: the batch shrinks as the short ones end);
  4. burst with `drop` of the clients leaving mid-stream.
Reports output tokens/s, time to first token and inter-token latency (p50/p99,
measured by the clients), requests lost, and KV blocks still in use afterwards
(from /metrics). Prints figures; asserts nothing.

Usage: python bench/serve_load.py [--model DIR] [--clients 64] [--per-client 3] [--drop 16]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time

import httpx
import numpy as np
import openai

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
TOPICS = ["rivers", "mountains", "the moon", "bread", "trains", "music", "bees", "glass", "rain",
          "chess", "maps", "paper", "salt", "clocks", "bridges", "tea"]
ASKS = ["Say one thing about {t}.",
        "Explain {t} to a child in a few sentences.",
        "Write a short story in which {t} matter to a family that lives by the sea, with a "
        "beginning, a middle and an end, and a little dialogue between two of them.",
        "List some facts about {t}, then describe how people used {t} a hundred years ago and "
        "how they use {t} today, and end with a question for the reader."]


def workload(n: int, seed: int = 0) -> list[tuple[list[dict], int]]:
    """n chat requests: (messages, output tokens); prompts of four lengths, output
    lengths log-normal (median ~60 tokens) clipped to [16, 256]."""
    rng = np.random.default_rng(seed)
    lengths = np.clip(rng.lognormal(4.1, 0.7, n).astype(int), 16, 256)
    return [([{"role": "user", "content": ASKS[i % 4].format(t=TOPICS[i % len(TOPICS)])}],
             int(lengths[i])) for i in range(n)]


async def one_client(client, model: str, messages, max_tokens: int, drop_after: int | None) -> dict:
    """Stream one chat completion; record when each content chunk came."""
    start = time.perf_counter()
    times, usage, finish = [], None, None
    stream = await client.chat.completions.create(
        model=model, messages=messages, max_tokens=max_tokens, temperature=0, stream=True,
        stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
    try:
        async for chunk in stream:
            if chunk.usage is not None:
                usage = chunk.usage
            for choice in chunk.choices:
                if choice.delta.content:
                    times.append(time.perf_counter() - start)
                finish = choice.finish_reason or finish
            if drop_after is not None and len(times) >= drop_after:
                break  # the client goes away mid-stream
    finally:
        await stream.close()
    return {"times": times, "finish": finish, "dropped": drop_after is not None,
            "tokens": usage.completion_tokens if usage else None, "wanted": max_tokens}


async def run_phase(url: str, model: str, requests, clients: int, drop: int = 0) -> dict:
    """`clients` workers stream the requests from a shared queue, each one request
    at a time; the first `drop` requests are abandoned after 4 chunks."""
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0,
                                timeout=600)
    queue = list(enumerate(requests))[::-1]
    results: list = [None] * len(requests)

    async def worker():
        while queue:
            i, (messages, max_tokens) = queue.pop()
            try:
                results[i] = await one_client(client, model, messages, max_tokens,
                                              4 if i < drop else None)
            except Exception as e:  # counted as lost
                results[i] = e
    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(clients)))
    seconds = time.perf_counter() - start
    await client.close()
    kept = [r for r in results if isinstance(r, dict) and not r["dropped"]]
    lost = sum(1 for r in results if not isinstance(r, dict)) + sum(
        1 for r in kept if r["finish"] != "length" or r["tokens"] != r["wanted"])
    ttft = [r["times"][0] for r in kept if r["times"]]
    itl = [b - a for r in kept for a, b in zip(r["times"], r["times"][1:])]
    tokens = sum(r["tokens"] or 0 for r in kept)
    chunks = sum(len(r["times"]) for r in kept)
    return {"requests": len(requests), "clients": clients, "dropped": drop, "seconds": seconds,
            "output_tokens": tokens, "tokens_per_s": tokens / seconds,
            "ttft_p50_s": float(np.percentile(ttft, 50)), "ttft_p99_s": float(np.percentile(ttft, 99)),
            "itl_p50_s": float(np.percentile(itl, 50)), "itl_p99_s": float(np.percentile(itl, 99)),
            "tokens_per_chunk": tokens / max(chunks, 1), "lost": lost}


def metrics(url: str) -> dict:
    values = {}
    for line in httpx.get(url + "/metrics").text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            values[name.split("{")[0]] = float(value)
    return values


def settle(url: str) -> dict:
    """Metrics once the server has nothing running (an abort lands within a step)."""
    deadline = time.monotonic() + 30
    while True:
        m = metrics(url)
        if m["vllm:num_requests_running"] == 0 or time.monotonic() > deadline:
            return m
        time.sleep(0.05)


def start_server(args) -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, os.path.join(ROOT, "cli.py"), "serve", "--port", str(port),
           "--kv-cache-memory", args.kv_cache_memory, "--max-waiting", "1024"]
    if args.model:
        cmd += ["--model", args.model]
    proc = subprocess.Popen(cmd)
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return proc, url
        except httpx.TransportError:
            time.sleep(0.1)
    raise SystemExit("the server did not start")


PHASES = ("one_at_a_time", "concurrent", "burst", "burst_with_drops")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="HF model folder (default: the pulled SmolLM2)")
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--per-client", type=int, default=3, help="requests per client")
    parser.add_argument("--drop", type=int, default=16, help="clients that leave mid-stream")
    parser.add_argument("--kv-cache-memory", default="1G")
    parser.add_argument("--out", default="serve-load.json")
    args = parser.parse_args()
    proc, url = start_server(args)
    results = {}
    try:
        model = httpx.get(url + "/v1/models").json()["data"][0]["id"]
        requests = workload(args.clients * args.per_client)
        asyncio.run(run_phase(url, model, requests[:2], clients=1))  # warm up
        runs = {"one_at_a_time": (requests, 1, 0), "concurrent": (requests, args.clients, 0),
                "burst": (requests[:args.clients], args.clients, 0),
                "burst_with_drops": (requests[:args.clients], args.clients, args.drop)}
        for name in PHASES:
            results[name] = asyncio.run(run_phase(url, model, *runs[name]))
            after = settle(url)
            results[name]["kv_blocks_after"] = int(after["tinypaged:kv_blocks_used"])
            results[name]["running_after"] = after["vllm:num_requests_running"]
            print(f"{name}: {json.dumps(results[name])}", flush=True)
    finally:
        proc.send_signal(signal.SIGTERM)
        exit_status = proc.wait(timeout=60)
    results["server_exit_status"] = exit_status
    base = results["one_at_a_time"]["tokens_per_s"]
    print("\n| run | tokens/s (vs one at a time) | TTFT p50 / p99 | ITL p50 / p99 | lost | KV in use after |")
    print("|---|---|---|---|---|---|")
    for name in PHASES:
        r = results[name]
        print(f"| {name}: {r['requests']} requests, {r['clients']} clients, {r['dropped']} dropped | "
              f"{r['tokens_per_s']:.0f} (x{r['tokens_per_s'] / base:.2f}) | "
              f"{r['ttft_p50_s'] * 1e3:.0f} / {r['ttft_p99_s'] * 1e3:.0f} ms | "
              f"{r['itl_p50_s'] * 1e3:.0f} / {r['itl_p99_s'] * 1e3:.0f} ms | {r['lost']} | "
              f"{r['kv_blocks_after']} blocks |")
    print(f"\nserver exit status {exit_status}")
    with open(args.out, "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
