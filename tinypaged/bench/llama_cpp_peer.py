"""The CPU peer: llama.cpp's own benchmarks on the same GGUF with the same threads.

Only when `cli.py bench --llama-bench PATH` names a built `llama-bench`; its sibling
`llama-batched-bench` (same folder), when present, gives the 32-concurrent decode
rate. Both run with LD_LIBRARY_PATH at their folder (a shared-library build keeps
libllama and libggml there). bench/NOTES.md says how the peer was built.
"""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

THREADS = 2  # this project's CPU: both cores, as numba and BLAS use them


def _run(binary: Path, args: list[str], timeout: float = 900) -> str:
    env = dict(os.environ, LD_LIBRARY_PATH=str(binary.parent))
    done = subprocess.run([str(binary), *args], capture_output=True, text=True, env=env,
                          timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"{binary.name} failed ({done.returncode}): {done.stderr[-600:]}")
    return done.stdout


def decode_batch1(llama_bench: Path, gguf: Path, n_gen: int = 64, repetitions: int = 5) -> dict:
    """llama-bench's text generation rate (tokens/s): batch 1, n_gen tokens."""
    rows = json.loads(_run(llama_bench, ["-m", str(gguf), "-t", str(THREADS), "-p", "0",
                                         "-n", str(n_gen), "-r", str(repetitions), "-o", "json"]))
    row = next(r for r in rows if r.get("n_gen") == n_gen)
    return {"tokens_per_s": float(row["avg_ts"]), "stddev": float(row["stddev_ts"]),
            "n_gen": n_gen, "build": row.get("build_commit", "?"), "cpu": row.get("cpu_info", "?")}


def prefill(llama_bench: Path, gguf: Path, n_prompt: int, repetitions: int = 1) -> float:
    """llama-bench's prompt processing rate (tokens/s) for an n_prompt-token prompt."""
    rows = json.loads(_run(llama_bench, ["-m", str(gguf), "-t", str(THREADS), "-p", str(n_prompt),
                                         "-n", "0", "-r", str(repetitions), "-o", "json"]))
    return float(next(r for r in rows if r.get("n_prompt") == n_prompt)["avg_ts"])


def decode_at_depth(llama_bench: Path, gguf: Path, depth: int, n_gen: int = 64,
                    repetitions: int = 1) -> float:
    """llama-bench's batch-1 generation rate (tokens/s) with `depth` tokens already in
    the context (its -d: the prompt is processed first, untimed)."""
    rows = json.loads(_run(llama_bench, ["-m", str(gguf), "-t", str(THREADS), "-p", "0",
                                         "-n", str(n_gen), "-d", str(depth), "-r", str(repetitions),
                                         "-o", "json"]))
    return float(next(r for r in rows if r.get("n_gen") == n_gen)["avg_ts"])


def completion_command(llama_bench: Path, gguf: Path, prompt_file: Path, context: int,
                       n_gen: int) -> list[str]:
    """llama-completion (beside llama-bench) generating n_gen tokens after the prompt in
    prompt_file with a `context`-token KV cache, then exiting: a user's whole run."""
    return [str(llama_bench.parent / "llama-completion"), "-m", str(gguf), "-t", str(THREADS),
            "-c", str(context), "-f", str(prompt_file), "-n", str(n_gen), "--temp", "0",
            "-no-cnv", "--simple-io", "--no-warmup"]


def library_env(llama_bench: Path) -> dict:
    return dict(os.environ, LD_LIBRARY_PATH=str(llama_bench.parent))


def decode_concurrent(batched_bench: Path, gguf: Path, concurrency: int = 32,
                      prompt_len: int = 16, n_gen: int = 32) -> dict:
    """llama-batched-bench: `concurrency` sequences decoding together; the rate of the
    generation phase alone (tokens/s over all sequences)."""
    args = ["-m", str(gguf), "-t", str(THREADS), "-tb", str(THREADS), "-c",
            str(concurrency * (prompt_len + n_gen) + 64), "-b", "2048", "-ub", "512",
            "-npp", str(prompt_len), "-ntg", str(n_gen), "-npl", str(concurrency),
            "--output-format", "jsonl"]
    lines = [json.loads(line) for line in _run(batched_bench, args).splitlines()
             if line.startswith("{")]
    row = next(r for r in lines if r.get("pl") == concurrency)
    return {"tokens_per_s": float(row["speed_tg"]), "concurrency": concurrency,
            "prompt_len": prompt_len, "n_gen": n_gen}


def run(llama_bench: str, gguf: Path, log) -> dict:
    binary = Path(llama_bench)
    out = {"batch1": decode_batch1(binary, gguf)}
    log(f"llama.cpp: batch 1 {out['batch1']['tokens_per_s']:.0f} tokens/s")
    batched = binary.parent / "llama-batched-bench"
    if batched.is_file():
        out["concurrent32"] = decode_concurrent(batched, gguf)
        log(f"llama.cpp: 32 concurrent {out['concurrent32']['tokens_per_s']:.0f} tokens/s")
    return out
