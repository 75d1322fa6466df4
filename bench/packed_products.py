"""The CPU's packed products (kernels/cpu/lanes_product.py) on SmolLM2's shapes, against
the float16 paths measured in the same run.

1. Batch 1 (the GEMV): microseconds a call, the weight bytes it streams per second,
   and the float16 GEMV on the same matrix (what a float16 model pays).
2. 32 rows of x (batched decode) and 128 (prefill): the packed GEMM against gemm.py's
   float GEMM (float16 weights) and, at 128 rows, BLAS on the float32 matrix.
3. The integer dot-product instructions LLVM chose for the GEMV on this CPU (vpdpbusd
   with AVX-512 VNNI; vpmaddubsw + vpmaddwd on AVX2; byte_dot.LANES_ISA).
Usage: python bench/packed_products.py
"""
import collections
import os
import re
import sys
import time

import numpy as np
from numba import njit

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from tinypaged.formats.packed import PackedWeight  # noqa: E402
from tinypaged.formats.quant_kind import KINDS, Q4_0, Q4_1, Q4_K, Q5_0, Q5_K, Q6_K, Q8_0  # noqa: E402
from tinypaged.kernels.cpu import lanes_product  # noqa: E402
from tinypaged.kernels.cpu.byte_dot import LANES_ISA  # noqa: E402
from tinypaged.kernels.cpu.kind_arg import kind_arg  # noqa: E402
from tinypaged.kernels.cpu.lane_packed import LanePacked  # noqa: E402
from tinypaged.kernels.cpu.linear import LinearWeight, linear  # noqa: E402

SHAPES = [(960, 576, "q/k/v stacked"), (3072, 576, "gate/up stacked"),
          (576, 1536, "down"), (576, 576, "o"), (49152, 576, "lm_head")]


def microseconds(f, reps: int) -> float:
    """Median of 5 runs of reps calls, after one warm-up call."""
    f()
    runs = []
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(reps):
            f()
        runs.append((time.perf_counter() - t) / reps * 1e6)
    return float(np.median(runs))


def main() -> None:
    rng = np.random.default_rng(0)
    print(f"byte dot: {LANES_ISA}")
    print(f"{'type':5} {'shape':>12} {'matrix':16} {'packed us':>9} {'GB/s':>6} {'f16 us':>7} {'x f16':>6}")
    for ggml_type in (Q8_0, Q4_0, Q4_1):
        for n, k, what in SHAPES:
            w = rng.standard_normal((n, k)).astype(np.float32)
            laid = LanePacked.of(PackedWeight.quantize(w, ggml_type))
            half = LinearWeight(w.astype(np.float16))
            x = rng.standard_normal((1, k)).astype(np.float32)
            reps = 20 if n > 10000 else 200
            t_packed = microseconds(lambda: linear(x, laid), reps)
            t_half = microseconds(lambda: linear(x, half), reps)
            print(f"{KINDS[ggml_type].name:5} {n:>6}x{k:<5} {what:16} {t_packed:9.0f} "
                  f"{laid.nbytes / t_packed / 1e3:6.1f} {t_half:7.0f} {t_half / t_packed:6.2f}")
    print(f"\n{'type':5} {'shape':>12} {'rows':>4} {'packed ms':>9} {'f16 GEMM':>8} {'BLAS f32':>8}")
    for ggml_type in (Q8_0, Q4_1, Q4_K):
        for n, k, what in SHAPES[1:3]:
            w = rng.standard_normal((n, k)).astype(np.float32)
            if ggml_type == Q4_K and k % 256:
                continue
            laid = LanePacked.of(PackedWeight.quantize(w, ggml_type)) if ggml_type != Q4_K else \
                LanePacked.of(PackedWeight.from_bytes(
                    rng.integers(0, 256, n * k // 256 * 144, dtype=np.uint8), Q4_K, (n, k)))
            half = LinearWeight(w.astype(np.float16))
            for rows in (32, 128):
                x = rng.standard_normal((rows, k)).astype(np.float32)
                packed = microseconds(lambda: linear(x, laid), 5) / 1e3
                f16 = microseconds(lambda: linear(x, half), 5) / 1e3  # gemm.py up to 64 rows
                blas = microseconds(lambda: x @ w.T, 5) / 1e3 if rows > 64 else float("nan")
                print(f"{KINDS[ggml_type].name:5} {n:>6}x{k:<5} {rows:>4} {packed:9.2f} {f16:8.2f} {blas:8.2f}")
    wanted = ("dpbusd", "pmaddubs", "pmaddwd")
    x = rng.standard_normal((1, 512)).astype(np.float32)
    for ggml_type in (Q8_0, Q4_1, Q5_0, Q4_K, Q5_K, Q6_K):  # (random bytes: only the code matters)
        kind = KINDS[ggml_type]
        raw = rng.integers(0, 256, 64 * 512 // kind.block * kind.block_bytes, dtype=np.uint8)
        laid = LanePacked.of(PackedWeight.from_bytes(raw, ggml_type, (64, 512)))
        fresh = njit(lanes_product._gemv_range.py_func)  # (the cached one shows no assembly)
        fresh(0, kind_arg(kind), *lanes_product._gemv_x(kind_arg(kind), x),
              (laid.quants, laid.scales, laid.mins, laid.supers, laid.fifths), np.empty((1, 64), np.float32))
        asm = fresh.overloads[fresh.signatures[-1]].library.get_asm_str()
        ops = collections.Counter(re.findall(r"^\s+(v\w+)", asm, re.M))
        print(f"_gemv_range for {kind.name}:", {op: c for op, c in ops.items()
                                                 if any(w in op for w in wanted + ("vpmulld",))})


if __name__ == "__main__":
    main()
