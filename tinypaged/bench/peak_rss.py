"""Peak resident memory of a whole `cli.py generate` run, measured from outside.

Each run is a fresh process (a wrapper that starts `generate` and reports its
children's peak RSS), so the figure holds everything a user's process holds:
Python, NumPy, numba's compiled kernels, the weights, the KV pool.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

CLI = Path(__file__).resolve().parents[2] / "cli.py"
_WRAPPER = ("import resource, subprocess, sys\n"
            "done = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)\n"
            "if done.returncode: sys.exit(done.stderr.decode()[-600:])\n"
            "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n")  # KiB on Linux


def generate_peak_rss(model, extra: list[str] = (), kv_cache_memory: str = "64M") -> int:
    """Peak RSS in bytes of `cli.py generate` on `model`, 32 greedy tokens."""
    cmd = [sys.executable, str(CLI), "generate", "The capital of France is", "--model", str(model),
           "--max-tokens", "32", "--temperature", "0", "--kv-cache-memory", kv_cache_memory, *extra]
    done = subprocess.run([sys.executable, "-c", _WRAPPER, *cmd], capture_output=True, text=True,
                          timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"generate failed: {done.stderr.strip()}")
    return int(done.stdout.split()[-1]) * 1024


def available() -> bool:
    return CLI.is_file()
