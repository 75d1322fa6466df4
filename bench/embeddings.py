"""Embedding throughput: a batch of documents embedded at once, tokens/s, tinypaged's
LLM.embed beside llama.cpp's server with --embeddings on the same GGUF (2 threads,
last-token pooling on both), alternated, medians.

    python bench/embeddings.py [--model GGUF] [--docs 64] [--tokens 256] [--rounds 3]
        [--llama-server PATH]

Documents are random token ids (no prefix shared: the prefix cache is off on ours,
llama-server's cache_prompt off), the same ids to both.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from tinypaged import LLM  # noqa: E402


def llama_server(binary: str, model: str, docs: int, tokens: int):
    """(url, process) of llama-server embedding with last-token pooling, loaded."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    process = subprocess.Popen(
        [binary, "-m", model, "-t", "2", "--port", str(port), "--embeddings", "--pooling", "last",
         "-c", str(docs * (tokens + 8)), "-np", "1", "-b", "2048", "-ub", "2048"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            with urllib.request.urlopen(url + "/health", timeout=1) as r:
                if r.status == 200:
                    return url, process
        except OSError:
            time.sleep(0.1)
    process.kill()
    raise RuntimeError("llama-server did not start")


def llama_embed(url: str, batch: list[list[int]]) -> list[list[float]]:
    body = json.dumps({"input": batch, "encoding_format": "float"}).encode()
    request = urllib.request.Request(url + "/v1/embeddings", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=600) as response:
        return [d["embedding"] for d in json.load(response)["data"]]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=os.path.join(ROOT, "weights", "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--docs", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--llama-server")
    args = ap.parse_args()
    llm = LLM(args.model, backend="cpu", enable_prefix_caching=False)
    rng = np.random.default_rng(0)
    batch = [rng.integers(100, llm.tokenizer.vocab_size - 100, args.tokens).tolist()
             for _ in range(args.docs)]
    total = args.docs * args.tokens
    llm.embed(batch[:2])  # (warm: kernels)
    server = llama_server(args.llama_server, args.model, args.docs, args.tokens) \
        if args.llama_server else None
    rates = {"tinypaged": [], "llama-server": []}
    try:
        if server:
            llama_embed(server[0], batch[:2])
        for r in range(args.rounds):
            for name in (("tinypaged", "llama-server") if r % 2 == 0 else ("llama-server", "tinypaged")):
                if name == "llama-server" and not server:
                    continue
                start = time.perf_counter()
                if name == "tinypaged":
                    ours = llm.embed(batch)
                else:
                    theirs = llama_embed(server[0], batch)
                rates[name].append(total / (time.perf_counter() - start))
    finally:
        if server:
            server[1].terminate()
            server[1].wait()
    print(f"| engine | tokens/s ({args.docs} x {args.tokens} tokens) | rounds |\n|---|---|---|")
    for name, values in rates.items():
        if values:
            print(f"| {name} | {np.median(values):.0f} | {', '.join(f'{v:.0f}' for v in values)} |")
    if server:
        ratio = np.median(rates["tinypaged"]) / np.median(rates["llama-server"])
        cosines = [float(np.dot(a, b) / np.linalg.norm(a) / np.linalg.norm(b)) for a, b in zip(ours, theirs)]
        print(f"\ntinypaged / llama-server: {ratio:.2f}x; the two engines' vectors agree to "
              f"cosine {min(cosines):.4f}-{max(cosines):.4f}")


if __name__ == "__main__":
    main()
