"""Decode rates of one model, measured in a process of its own:
`python -m tinypaged.bench.format_rates PATH [QUANTIZATION]` prints one JSON line.

The weight-format rows run each format this way, as llama-bench runs, so that
nothing left by the earlier rows can touch them. Something did once: inside the
long `cli.py bench` process batch-1 rates came out 20-40% below a fresh
process's. The cause was an LLM that could not be collected (fixed in the engine
loop): its thread's OpenMP team slowed every parallel kernel call of the others.
"""
from __future__ import annotations

import json
import statistics
import subprocess
import sys

from .. import LLM, SamplingParams
from .rates import KV_BUDGET, MAX_MODEL_LEN, decode_rate


def measure(path: str, quantization: str | None = None, rounds: int = 3) -> dict:
    """Medians over `rounds` of batch-1 decode (64 tokens, as llama-bench's tg64) and
    of 32 concurrent requests (32 tokens each), plus the weights' bytes."""
    llm = LLM(path, kv_cache_memory=KV_BUDGET, max_model_len=MAX_MODEL_LEN,
              quantization=quantization)
    decode_rate(llm, 1, SamplingParams(temperature=0, max_tokens=4))  # compile, warm
    one = SamplingParams(temperature=0, max_tokens=64, ignore_eos=True)
    many = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
    batch1 = [decode_rate(llm, 1, one) for _ in range(rounds)]
    concurrent = [decode_rate(llm, 32, many) for _ in range(rounds)]
    return {"batch1_tokens_per_s": statistics.median(batch1),
            "concurrent32_tokens_per_s": statistics.median(concurrent),
            "weight_bytes": llm.stats()["weight_bytes"],
            "runs": {"batch1": batch1, "concurrent32": concurrent}}


def measure_in_own_process(path, quantization: str | None = None) -> dict:
    cmd = [sys.executable, "-m", "tinypaged.bench.format_rates", str(path)]
    done = subprocess.run(cmd + ([quantization] if quantization else []), capture_output=True,
                          text=True, timeout=1200)
    if done.returncode != 0:
        raise RuntimeError(f"measuring {path} failed: {done.stderr[-800:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    print(json.dumps(measure(*sys.argv[1:3])))
