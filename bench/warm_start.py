"""Warm start: seconds from launching the command to its first generated text on stdout,
for `tinypaged generate` (kernels already in numba's disk cache, the prepared layout
beside the GGUF) and llama.cpp's llama-completion on the same file, alternated.

    python bench/warm_start.py [--llama-completion PATH] [--rounds 5]

Each command runs once untimed first (caches warmed). Prints the medians and the ratio.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROMPT = "The capital of France is"


def first_text_seconds(command: list[str]) -> float:
    """Seconds from start until the command's stdout carries a byte that is not blank."""
    start = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    seen = None
    while True:
        byte = process.stdout.read(1)
        if not byte:
            break
        if not byte.isspace():
            seen = time.perf_counter() - start
            break
    process.stdout.read()
    process.wait()
    if seen is None:
        raise RuntimeError(f"{command[0]} printed no text (exit status {process.returncode})")
    return seen


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=os.path.join(ROOT, "weights", "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--llama-completion", help="llama.cpp's llama-completion binary")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    commands = {"tinypaged generate": [sys.executable, "-m", "tinypaged", "generate", PROMPT,
                                       "--model", args.model, "--max-tokens", "8",
                                       "--temperature", "0", "--backend", "cpu"]}
    if args.llama_completion:
        commands["llama-completion"] = [args.llama_completion, "-m", args.model, "-p", PROMPT,
                                        "-n", "8", "--temp", "0", "-t", "2", "-no-cnv",
                                        "--no-display-prompt", "--simple-io"]
    for command in commands.values():
        first_text_seconds(command)  # (warm: kernels, layout, the page cache)
    seconds = {name: [] for name in commands}
    for r in range(args.rounds):
        for name in (commands if r % 2 == 0 else reversed(list(commands))):
            seconds[name].append(first_text_seconds(commands[name]))
    print("| command | first text, s (median) | runs |\n|---|---|---|")
    for name, values in seconds.items():
        print(f"| {name} | {np.median(values):.3f} | {', '.join(f'{v:.2f}' for v in values)} |")
    if len(seconds) == 2:
        ours, theirs = (np.median(v) for v in seconds.values())
        print(f"\ntinypaged / llama-completion: {ours / theirs:.2f}x")


if __name__ == "__main__":
    main()
