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
    main, again = result.stdout.split("the step model on this card's figures: none measured\n", 1)
    table = [line for line in main.splitlines() if line.startswith("| ")]
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
    assert [f for f in figures if f.startswith("batch-1 GEMV")] == [
        f"batch-1 GEMV 32->40 ({form})" for form in (
            "f16 W, a row a block", "f16 W, two rows a block", "f16 W, two rows a block, loads hoisted",
            "Q8_0 W, a row a block", "Q8_0 W, two rows a block")] + [
        "batch-1 GEMV 48->24 (f16 W, 8-row loop)", "batch-1 GEMV 48->24 (f16 W, loads hoisted)",
        "batch-1 GEMV 64->24 (Q4_1 W, 8-row loop)", "batch-1 GEMV 64->24 (Q4_1 W, one-row form)"]
    assert [f for f in figures if f.startswith("a dependent global load")] == [
        "a dependent global load, HBM (64 KB chain)", "a dependent global load, L2 (64 KB chain)",
        "a dependent global load, L1 (16 KB chain)"]
    # every modeled figure predicted again on the card's figures (the simulator's: none)
    modeled = [line.split(" | ")[0].lstrip("| ") for line in again.splitlines()[2:] if line.startswith("| ")]
    assert modeled == [f for f in figures if f.startswith(("model decode, batch 1, graph",
                                                            "model decode, batch 2, graph",
                                                            "model prefill", "Llama-3.2-1B shapes"))]


def test_a_load_chain_is_one_cycle_through_every_line():
    """The round-trip figure's chain (bench/calibration.py): each load a new line, every
    line once, back to the first: no shorter cycle for the caches to hold."""
    sys.path.insert(0, str(ROOT / "bench"))
    import numpy as np
    from calibration import LINE_WORDS, load_chain
    chain = load_chain(1000, np.random.default_rng(0))
    seen, j = [], 0
    for _ in range(1000):
        j = int(chain[j])
        seen.append(j)
    assert j == 0 and sorted(seen) == list(range(0, 1000 * LINE_WORDS, LINE_WORDS))



def test_the_cards_test_run_takes_the_cuda_tests_of_every_listed_file():
    """The card's test run (gpu_check.cuda_test_command) collects cuda tests from every
    file the GPU image can import, none from another, no compile-only ones; with
    workers, a test at a time."""
    sys.path.insert(0, str(ROOT / "bench"))
    import gpu_check
    from cuda_test_files import ON_THE_GPU_IMAGE
    command = gpu_check.cuda_test_command(with_smollm2=False, workers=1)
    result = subprocess.run([*command, "--collect-only"], capture_output=True, text=True,
                            cwd=ROOT, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    collected = [line for line in result.stdout.splitlines() if "::" in line]  # (-q: node ids)
    assert {line.split("::")[0].rsplit("/", 1)[-1] for line in collected} == set(ON_THE_GPU_IMAGE)
    assert len(collected) > 100
    assert not [line for line in collected if "smollm2" in line.lower()]
    assert "-n" not in command
    assert gpu_check.cuda_test_command(True, 8)[4:10] == ["-m", "cuda and not ptx", "-n", "8", "--dist", "load"]
