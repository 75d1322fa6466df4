"""Peak resident memory of a whole `cli.py generate` run, measured from outside.

Each run is a fresh process (a wrapper that starts `generate` and reports its
children's peak RSS), so the figure holds everything a user's process holds:
Python, NumPy, numba's compiled kernels, the weights, the KV pool.
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CLI = Path(__file__).resolve().parents[2] / "cli.py"
# Linux keeps a process's peak RSS across exec (the old image's counts), so the
# measured command runs under a small wrapper process, whose children's peak is the
# command's own
_WRAPPER = ("import resource, subprocess, sys\n"
            "done = subprocess.run(sys.argv[1:])\n"
            "peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss\n"
            "print(f'\\npeak-rss-kib {peak}')\n"
            "sys.exit(done.returncode)\n")


def timed_process(cmd: list[str], env: dict | None = None) -> dict:
    """Run cmd to its end: {"seconds": wall time, "peak_rss": its peak resident bytes,
    "output": its stdout and stderr}; RuntimeError if it fails."""
    with tempfile.TemporaryFile("w+") as log:
        started = time.perf_counter()
        done = subprocess.run([sys.executable, "-c", _WRAPPER, *cmd], stdout=log,
                              stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
        seconds = time.perf_counter() - started
        log.seek(0)
        output = log.read()
    if done.returncode != 0:
        raise RuntimeError(f"{os.path.basename(cmd[0])} failed ({done.returncode}): {output[-800:]}")
    peak = int(output.rsplit("peak-rss-kib ", 1)[1].split()[0]) * 1024  # KiB on Linux
    return {"seconds": seconds, "peak_rss": peak, "output": output}


def generate_peak_rss(model, extra: list[str] = (), kv_cache_memory: str = "64M") -> int:
    """Peak RSS in bytes of `cli.py generate` on `model`, 32 greedy tokens."""
    cmd = [sys.executable, str(CLI), "generate", "The capital of France is", "--model", str(model),
           "--max-tokens", "32", "--temperature", "0", "--kv-cache-memory", kv_cache_memory, *extra]
    return timed_process(cmd)["peak_rss"]


def available() -> bool:
    return CLI.is_file()
