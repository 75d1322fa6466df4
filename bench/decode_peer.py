"""Decode rates beside llama.cpp's, on the same GGUF files, the same 2 threads, in one
run: batch 1 (what a chat user feels) and 32 concurrent requests.

For each model the two engines take turns, --rounds times (this VM's speed drifts by
10-40% over tens of seconds, so a figure measured minutes from its peer's means
little); each row reports the medians, the ratio to llama.cpp, and for batch 1 the
GB/s of weights read (every weight byte once a token: the engine's held bytes for
tinypaged, the file's tensor bytes for llama.cpp).

Rows: SmolLM2-135M-Instruct Q4_1 (the default model's GGUF) and Gemma 3 270M Q4_K_M,
each where its file is in weights/. llama.cpp: llama-bench (batch 1) and
llama-batched-bench (32 sequences); bench/NOTES.md has the build recipe.

Usage: python bench/decode_peer.py --llama-bench PATH [--rounds 3] [--models smollm2,gemma3]
Prints a table; asserts nothing.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tinypaged import LLM, SamplingParams  # noqa: E402
from tinypaged.bench import llama_cpp_peer  # noqa: E402
from tinypaged.bench.suite import decode_rate  # noqa: E402
from tinypaged.model.gguf import GGUFFile  # noqa: E402

MODELS = {"smollm2": ROOT / "weights" / "SmolLM2-135M-Instruct.Q4_1.gguf",
          "gemma3": ROOT / "weights" / "gemma-3-270m-q4_k_m.gguf"}
BATCH1 = SamplingParams(temperature=0, max_tokens=64, ignore_eos=True)
CONCURRENT = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)


def file_tensor_bytes(gguf: Path) -> int:
    return sum(t.nbytes for t in GGUFFile(gguf).tensors.values())


def measure(gguf: Path, llama_bench: Path, rounds: int) -> dict:
    llm = LLM(str(gguf), backend="cpu")
    ours_bytes = llm.stats()["weight_bytes"]
    decode_rate(llm, 1, BATCH1)  # compiles every kernel for these shapes
    decode_rate(llm, 32, CONCURRENT)
    batched = llama_bench.parent / "llama-batched-bench"
    runs = {k: [] for k in ("ours1", "peer1", "ours32", "peer32")}
    for _ in range(rounds):
        runs["ours1"].append(decode_rate(llm, 1, BATCH1))
        runs["peer1"].append(llama_cpp_peer.decode_batch1(llama_bench, gguf, repetitions=1)
                             ["tokens_per_s"])
        runs["ours32"].append(decode_rate(llm, 32, CONCURRENT))
        if batched.is_file():
            runs["peer32"].append(llama_cpp_peer.decode_concurrent(batched, gguf)["tokens_per_s"])
    llm.close()
    med = {k: statistics.median(v) if v else float("nan") for k, v in runs.items()}
    return {"runs": runs, "median": med, "ours_bytes": ours_bytes,
            "file_bytes": file_tensor_bytes(gguf)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--llama-bench", required=True, type=Path)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--models", default=",".join(MODELS))
    args = parser.parse_args()
    print(f"machine: {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}; "
          f"{args.rounds} rounds alternated; medians")
    print("| model | engine | batch 1 tokens/s | weights GB/s | x llama.cpp | "
          "32 concurrent tokens/s | x llama.cpp |\n|---|---|---|---|---|---|---|")
    for name in args.models.split(","):
        gguf = MODELS[name]
        if not gguf.is_file():
            print(f"| {name} | (no {gguf.name} in weights/) |||||")
            continue
        r = measure(gguf, args.llama_bench, args.rounds)
        m = r["median"]
        print(f"| {name} | tinypaged | {m['ours1']:.1f} | {m['ours1'] * r['ours_bytes'] / 1e9:.1f} | "
              f"{m['ours1'] / m['peer1']:.2f} | {m['ours32']:.1f} | {m['ours32'] / m['peer32']:.2f} |")
        print(f"| {name} | llama.cpp | {m['peer1']:.1f} | {m['peer1'] * r['file_bytes'] / 1e9:.1f} | "
              f"1 | {m['peer32']:.1f} | 1 |")
        print("  runs: " + "; ".join(f"{k} " + ", ".join(f"{v:.0f}" for v in vs)
                                    for k, vs in r["runs"].items()), file=sys.stderr)


if __name__ == "__main__":
    main()
