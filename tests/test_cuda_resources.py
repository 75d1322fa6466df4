"""The static resource report (kernels/cuda/tools/resources.py): ptxas's figures through
nvJitLink, and the occupancy arithmetic, checked without a GPU."""
import json
import os
import subprocess
import sys

import pytest
from conftest import ROOT

from tinypaged.kernels.cuda.tools.resources import KernelResources

pytestmark = [pytest.mark.cuda, pytest.mark.ptx]  # compiled on the CPU: no GPU needed


@pytest.mark.parametrize("threads, registers, shared, want", [
    (256, 32, 0, 1.0),  # 8 warps x 8 blocks: the 2,048-thread limit
    (128, 38, 0, 0.75),  # 38 regs -> 1,280 a warp -> 51 warps -> 12 blocks of 4
    (32, 56, 768, 0.5),  # one warp a block: the 32-block limit
    (64, 105, 33984, 12 / 64),  # 14 x 256 regs a warp: 9 blocks; shared: 6 blocks
    (64, 34, 0, 50 / 64),  # 5 x 256 regs a warp: 51 warps, 25 blocks of 2
    (1024, 64, 0, 0.5),  # 64 regs: 32 warps, one block of 32
])
def test_occupancy_takes_the_first_limit(threads, registers, shared, want):
    assert KernelResources("k", threads, registers, 0, 0, shared).occupancy == pytest.approx(want)


SCRIPT = r"""
from numba import cuda, float32, types
from tinypaged.kernels.cuda.tools.resources import measure

def spilled(x, out):  # an array indexed by a runtime value lives in local memory
    acc = cuda.local.array(64, dtype=float32)
    for i in range(64):
        acc[i] = x[i]
    out[0] = acc[int(x[0]) % 64]

def shared(x, out):
    tile = cuda.shared.array((16, 16), dtype=float32)
    tile[cuda.threadIdx.x % 16, 0] = x[0]
    cuda.syncthreads()
    out[0] = tile[3, 0]

sig = (types.Array(types.float32, 1, "C"), types.Array(types.float32, 1, "C"))
for f in (spilled, shared):
    r = measure(f.__name__, cuda.compile_ptx(f, sig, cc=(9, 0))[0], 128)
    print(r.label, r.registers, r.stack_bytes, r.shared_bytes)
"""


def run_without_simulator(*args):
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    result = subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env,
                            timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout


def test_ptxas_figures_show_a_local_array_and_shared_memory():
    rows = {line.split()[0]: [int(v) for v in line.split()[1:]]
            for line in run_without_simulator("-c", SCRIPT).splitlines()}
    registers, stack, shared = rows["spilled"]
    assert registers > 0 and stack >= 64 * 4 and shared == 0
    registers, stack, shared = rows["shared"]
    assert stack == 0 and shared == 16 * 16 * 4


@pytest.fixture(scope="module")
def audit():
    """Every kernel compiled once for sm_90: PTX size, float64 instructions, resources;
    in two processes at once (~100 kernels: the longest test file otherwise)."""
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    command = [sys.executable, "-m", "tinypaged.kernels.cuda.tools.ptx", "--audit"]
    halves = [subprocess.Popen([*command, str(shard), "2"], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, env=env) for shard in (0, 1)]
    merged = {}
    for half in halves:
        out, err = half.communicate(timeout=600)
        assert half.returncode == 0, err[-2000:]
        merged.update(json.loads(out))
    return merged


def test_every_kernel_compiles_for_sm90_and_is_in_the_report(audit):
    per_dtype = {f"{k}[{d}]" for k in ("matmul_tiled", "matmul_tiled_qkv", "matmul_tiled_gate_up_silu",
                                       "gemv_rows", "gemv_qkv", "gemv_gate_up_silu", "gemv_paired_rows",
                                       "gemv_one_row", "gemv_one_row_paired",
                                       "gemv_rows_normed", "gemv_qkv_normed", "gemv_gate_up_silu_normed")
                 for d in ("f16", "f32")}
    per_pool = {f"{k}{pool}" for k in ("paged_attention_decode", "paged_attention_prefill[d64]",
                                        "paged_attention_prefill[d128]", "rope_write_kv", "copy_blocks")
                for pool in ("", "[kv-f16]", "[kv-int8]")}  # float32, float16 and int8 KV pools
    wide = ("q5_0", "q5_1", "q4_k", "q5_k", "q6_k")  # (no fused q/k/v: kquant_matmul.py)
    packed = {f"gemv_{q}{form}" for q in ("q8_0", "q4") for form in ("", "_qkv", "_gate_up_silu")}
    packed |= {f"gemv_{q}{form}" for q in wide for form in ("", "_gate_up_silu")}
    packed |= {"gemv_q8_0_paired", "gemv_q4_k_paired"}  # (lm_head's kinds whose pair fits: packed_matmul)
    # every family's four for one row of x (batch 1: q|k|v fused and two matrices in one
    # pass fit), but Q5_K's pair of rows (kquant_matmul.ONE_ROW_WITHOUT_PAIRS)
    packed |= {f"gemv_{q}_one_row{form}" for q in ("q8_0", "q4", *wide) for form in ("", "_qkv", "_gate_up_silu")}
    packed |= {f"gemv_{q}_one_row_paired" for q in ("q8_0", "q4", *wide) if q != "q5_k"}
    packed |= {f"matmul_tiled{form}_packed[{q}]" for q in ("q8_0", "q4") for form in ("", "_qkv", "_gate_up_silu")}
    # the wide kinds' tiled q, k and v one by one, and Q5_0's gate and up (kquant_matmul.py)
    packed |= {f"matmul_tiled_packed[{q}]" for q in wide}
    packed |= {f"matmul_tiled_gate_up_silu_packed[{q}]" for q in wide if q != "q5_0"}
    assert set(audit) == per_dtype | per_pool | packed | {"add_rms_norm",
                                                          "silu_mul", "scale", "add", "gelu_tanh_mul", "softcap",
                                                          "gather_rows",
                                                          "round_activations", "top_candidates",
                                                          "lora_shrink[f16]", "lora_expand[f16]",
                                                          "lora_shrink[f32]", "lora_expand[f32]"}
    assert all(r["ptx_bytes"] > 0 for r in audit.values())
    tiled = audit["matmul_tiled[f16]"]
    # x's and W's 64 x 16 slices in rows of 17 words, and the arrival flag
    assert (tiled["threads"], tiled["shared"]) == (256, 2 * 64 * 17 * 4 + 4)
    for label, r in audit.items():  # each thread's 4 x 4 sums and loads in flight in registers
        if label.startswith("matmul_tiled"):
            assert r["stack"] == 0 and r["spills"] == 0 and r["occupancy"] >= 0.25, label
    assert all(0 < r["occupancy"] <= 1 for r in audit.values())
    decode = {label: r for label, r in audit.items()
              if label.startswith(("gemv", "paged_attention_decode"))}
    # 3 GEMVs x (f16, f32, Q8_0, Q4_x), 2 x (Q5_0, Q5_1, Q4_K, Q5_K, Q6_K), attention x 3
    # pools (each merging its own partitions), the float ones again with a norm folded in,
    # rows in pairs (lm_head: float, Q8_0, Q4_K), the float rows and pairs for one row of x,
    # and the packed families' for one row of x
    assert len(decode) == 25 + 6 + 2 + 2 + 4 + 7 * 4 - 1
    for label, r in decode.items():
        # issue 11's bar for decode kernels: registers only, at least half the SM's threads;
        # decode attention hides latency by its loads in flight (a chunk's keys at once, at
        # most 128 registers), not by more warps: two 256-thread blocks an SM (batch 64's
        # 192 blocks in one wave)
        bar = 0.25 if label.startswith("paged_attention_decode") else 0.5
        assert r["stack"] == 0 and r["spills"] == 0 and r["occupancy"] >= bar, label
    top = audit["top_candidates"]  # the sampler's candidates: registers only, full occupancy
    assert top["stack"] == 0 and top["spills"] == 0 and top["occupancy"] >= 0.5
    for label, r in audit.items():  # a thread's 4 rows x 2 keys of scores, 4 x 4 (8) sums:
        if label.startswith("paged_attention_prefill"):  # registers over warps, 3 blocks an SM
            assert r["stack"] == 0 and r["spills"] == 0 and r["occupancy"] >= 0.18, label


def test_no_kernel_computes_in_float64(audit):
    """An integer or a Python float in float arithmetic makes it float64 on the GPU
    (issue 18, B1: add_rms_norm divided by its int64 width, 46 float64 instructions)."""
    assert {label: r["float64_instructions"] for label, r in audit.items()
            if r["float64_instructions"]} == {}


def test_the_kernels_that_promise_the_references_bits_fuse_nothing(audit):
    """NVVM fuses a*b + c into one FMA, which rounds once where NumPy rounds twice
    (issue 18, B2: round_activations' v * inverse + HALF_EVEN and RoPE's write of K
    held bit for bit only by luck of the seed). Their arithmetic is exact.py's."""
    exact = ["round_activations", "rope_write_kv", "rope_write_kv[kv-f16]", "rope_write_kv[kv-int8]"]
    assert {label: audit[label]["fma_instructions"] for label in exact} == dict.fromkeys(exact, 0)
    assert audit["gemv_rows[f32]"]["fma_instructions"] > 0  # (the count sees FMAs)


def test_the_float64_count_sees_a_float64_division():
    from tinypaged.kernels.cuda.tools.ptx import float64_instructions

    ptx = "\tdiv.rn.f64 \t%fd3, %fd1, %fd2;\n\tcvt.rn.f32.f64 \t%f2, %fd3;\n\tadd.f32 %f1, %f2, %f3;"
    assert float64_instructions(ptx) == 2


def test_device_functions_are_inlined_by_nvvm_unless_they_say_why():
    """numba's own inliner (inline="always") made the sm_90 compile ~4x slower
    (device_function.py): a device function takes @device_function, or its line says
    why it cannot."""
    for path in (ROOT / "tinypaged" / "kernels" / "cuda").rglob("*.py"):
        if path.name == "device_function.py":
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if "cuda.jit(device=True" in line:
                assert 'inline="always")  # (' in line, f"{path.name}:{number}: @device_function, or why not"
