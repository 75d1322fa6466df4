"""The static resource report (kernels/cuda/resources.py): ptxas's figures through
nvJitLink, and the occupancy arithmetic, checked without a GPU."""
import os
import subprocess
import sys

import pytest

from tinypaged.kernels.cuda.resources import KernelResources

pytestmark = pytest.mark.cuda


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
from tinypaged.kernels.cuda.resources import measure

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


def test_the_report_lists_every_kernel_as_launched():
    out = run_without_simulator("-m", "tinypaged.kernels.cuda.ptx", "--resources")
    rows = {line.split()[0]: line.split()[1:] for line in out.splitlines()[1:]}
    listed = run_without_simulator("-m", "tinypaged.kernels.cuda.ptx", "9.0")
    assert set(rows) == {line.split()[0] for line in listed.splitlines()}
    threads, registers, stack, spill, smem, occupancy = rows["matmul_tiled[f16]"]
    assert (threads, stack, smem) == ("256", "0", str(2 * 16 * 16 * 4))
    assert all(0 < float(r[-1].rstrip("%")) <= 100 for r in rows.values())
    decode = {label: r for label, r in rows.items()
              if label.startswith(("gemv", "paged_attention_decode", "merge_partitions"))}
    assert len(decode) == 15  # 3 GEMVs x (f16, f32, Q8_0, Q4_x), attention x 2 pools, merge
    for label, (threads, registers, stack, spill, smem, occupancy) in decode.items():
        # issue 11's bar for decode kernels: registers only, at least half the SM's threads
        assert stack == "0" and spill == "0" and float(occupancy.rstrip("%")) >= 50, label
    for label in ("paged_attention_prefill", "paged_attention_prefill[kv-f16]"):
        threads, registers, stack, spill, smem, occupancy = rows[label]
        assert spill == "0" and float(occupancy.rstrip("%")) >= 37  # was 19%: 64 threads, 105 regs
