"""Products with packed weights (kernels/cpu/quantized.py, packed_gemm.py) on
SmolLM2's shapes, against the float16 paths measured in the same run.

1. Batch 1 (the GEMV): microseconds a call, the weight bytes it streams per
   second, and the float16 GEMV on the same matrix (what a float16 model pays).
2. 32 rows of x (batched decode) and 128 (prefill): the group GEMM, its vpdpbusd
   and float32-lane forms, against gemm.py's float GEMM (float16 weights) and, at
   128 rows, BLAS on the float32 matrix.
3. The integer dot-product instructions LLVM chose for the GEMVs on this CPU
   (vpdpbusd with AVX-512 VNNI; vpmaddubsw + vpmaddwd on plain AVX2), and, with
   AVX-512 VNNI, for the GEMV on weights laid out 16 rows to a group (lanes.py: what
   the engine runs there).
Usage: python bench/int8_gemv.py
"""
import collections
import os
import re
import sys
import time

import numpy as np
from numba import njit

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from tinypaged.kernels.cpu import lanes_product, quantized  # noqa: E402
from tinypaged.kernels.cpu.lanes import LanePacked  # noqa: E402
from tinypaged.kernels.cpu.packed_gemm import HAS_VNNI, gemm_packed  # noqa: E402
from tinypaged.kernels.cpu.linear import LinearWeight, linear  # noqa: E402
from tinypaged.formats.quant_kind import Q4_0, Q4_1, Q4_K, Q5_0, Q5_K, Q6_K, Q8_0  # noqa: E402
from tinypaged.formats.packed import PackedWeight  # noqa: E402

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
    print(f"{'type':5} {'shape':>12} {'matrix':16} {'packed us':>9} {'GB/s':>6} {'f16 us':>7} {'x f16':>6}")
    for ggml_type, name in ((Q8_0, "Q8_0"), (Q4_0, "Q4_0"), (Q4_1, "Q4_1")):
        for n, k, what in SHAPES:
            w = rng.standard_normal((n, k)).astype(np.float32)
            packed, half = PackedWeight.quantize(w, ggml_type), LinearWeight(w.astype(np.float16))
            x = rng.standard_normal((1, k)).astype(np.float32)
            reps = 20 if n > 10000 else 200
            t_packed = microseconds(lambda: linear(x, packed), reps)
            t_half = microseconds(lambda: linear(x, half), reps)
            print(f"{name:5} {n:>6}x{k:<5} {what:16} {t_packed:9.0f} "
                  f"{packed.nbytes / t_packed / 1e3:6.1f} {t_half:7.0f} {t_half / t_packed:6.2f}")
    print(f"\n{'type':5} {'shape':>12} {'rows':>4} {'vnni ms':>8} {'f32 lanes':>9} "
          f"{'f16 GEMM':>8} {'BLAS f32':>8}")
    for ggml_type, name in ((Q8_0, "Q8_0"), (Q4_1, "Q4_1")):
        for n, k, what in SHAPES[1:3]:
            w = rng.standard_normal((n, k)).astype(np.float32)
            packed, half = PackedWeight.quantize(w, ggml_type), LinearWeight(w.astype(np.float16))
            for rows in (32, 128):
                x = rng.standard_normal((rows, k)).astype(np.float32)
                out = np.empty((rows, n), np.float32)
                forms = [microseconds(lambda: gemm_packed(x, packed.quants, packed.scales, packed.mins,
                                                          out, vnni=v), 5) / 1e3
                         for v in ((True,) if HAS_VNNI else ()) + (False,)]
                vnni = f"{forms[0]:8.2f}" if HAS_VNNI else f"{'-':>8}"
                f16 = microseconds(lambda: linear(x, half), 5) / 1e3  # gemm.py up to 64 rows
                blas = microseconds(lambda: x @ w.T, 5) / 1e3 if rows > 64 else float("nan")
                print(f"{name:5} {n:>6}x{k:<5} {rows:>4} {vnni} {forms[-1]:9.2f} {f16:8.2f} {blas:8.2f}")
    wanted = ("dpbusd", "pmaddubs", "pmaddwd")
    x = rng.standard_normal((1, 512)).astype(np.float32)
    weights = {name: PackedWeight.quantize(rng.standard_normal((64, 512)).astype(np.float32), t)
               for name, t in (("Q8_0", Q8_0), ("Q4_1", Q4_1))}
    for name, t, size in (("Q5_0", Q5_0, 22), ("Q4_K", Q4_K, 144), ("Q5_K", Q5_K, 176),
                          ("Q6_K", Q6_K, 210)):  # (random bytes: only the code matters here)
        raw = rng.integers(0, 256, 64 * 512 // (256 if size > 24 else 32) * size, dtype=np.uint8)
        weights[name] = PackedWeight.from_bytes(raw, t, (64, 512))
    for name, w in weights.items():
        fresh = njit(parallel=True)(quantized._gemv.py_func)  # the cached one cannot show its assembly
        fresh(x, w.quants, w.scales, w.mins, w.supers, w.highs, np.empty((1, 64), np.float32))
        asm = fresh.overloads[fresh.signatures[0]].library.get_asm_str()
        ops = collections.Counter(re.findall(r"^\s+(v\w+)", asm, re.M))
        print(f"_gemv for {name}: integer dot-product instructions",
              {op: c for op, c in ops.items() if any(w in op for w in wanted)})
        if HAS_VNNI:
            laid = LanePacked.of(w)
            fresh = njit(parallel=True)(lanes_product._gemv_lanes.py_func)
            fresh(x, laid.quants, laid.scales, laid.mins, laid.supers, laid.fifths,
                  np.empty((1, 64), np.float32))
            asm = fresh.overloads[fresh.signatures[0]].library.get_asm_str()
            ops = collections.Counter(re.findall(r"^\s+(v\w+)", asm, re.M))
            print(f"_gemv_lanes for {name}:", {op: c for op, c in ops.items()
                                                if any(w in op for w in wanted + ("vpmulld", "vmovdqu8"))})

if __name__ == "__main__":
    main()
