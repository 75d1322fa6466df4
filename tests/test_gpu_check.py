"""bench/gpu_check.py rehearsed on the CUDA simulator (--tiny), so that the script a
lent GPU's few minutes go to cannot trip on anything this machine can find first."""
import os
import re
import subprocess
import sys

from conftest import ROOT


def test_the_gpu_check_runs_through_on_the_simulator():
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "1"}
    result = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_check.py"), "--tiny"],
                            capture_output=True, text=True, env=env, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "preflight: a kernel compiled and ran" in result.stdout  # (no graph on the simulator)
    assert re.search(r"preflight: numpy \S+, numba \S+, llvmlite \S+, numba-cuda \S+, "
                     r"cuda-core \S+, cuda-bindings \S+", result.stdout)
    table = [line for line in result.stdout.splitlines() if line.startswith("| ")]
    figures = [line.split(" | ")[0].lstrip("| ") for line in table[1:]]
    assert "device copy bandwidth (read + write)" in figures
    assert "CUDA graph of 245 empty kernels, a node" in figures
    attention = [f for f in figures if f.startswith("paged attention decode")]
    assert [f.split(", ")[-1] for f in attention] == ["float32 pool", "float16 pool", "int8 pool"] * 2
    for batch in (1, 2):
        for mode in ("eager", "graph"):
            assert f"model decode, batch {batch}, {mode}" in figures
    assert "model decode, batch 1, graph, 14-16 keys" in figures  # (a long context's row, rehearsed)
    assert "model decode, batch 2, graph, 14-16 keys" in figures  # (batch 64 at 512 keys, rehearsed)
    assert "model prefill, a 40-token prompt, 512 a step" in figures
    for batch in (1, 2):  # the Llama-3.2-1B-shaped rows (bench/gpu_shapes.py)
        assert f"Llama-3.2-1B shapes, float16, decode batch {batch}, graph" in figures
    for batch, form in ((1, "float16"), (1, "Q4_K_M"), (9, "float16")):  # (a card: batch 64 for both)
        assert f"Llama-3.2-1B layer's products, {form}, batch {batch}" in figures
    assert "a step failed" not in result.stdout and "no decode step ran" not in result.stdout
