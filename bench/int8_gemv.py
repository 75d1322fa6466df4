"""Experiment for issue 10's batch-1 target: a Q4_1 GEMV on int8 activations.

x is quantized per 32-block to int8 (scale dx, block sums sx), as llama.cpp does,
and each block's dot product is an integer one: an llvmlite intrinsic loads 32
weight bytes and 32 activations as LLVM vectors (zero-extended nibbles times
sign-extended int8, reduce-add). LLVM turns that generic IR into vpdpbusd on a
CPU with AVX-512 VNNI (other CPUs get their own instructions: the IR names no
CPU feature). Prints the time of each SmolLM2 shape against the float kernel the
engine uses, the error bound that quantizing x costs, and the dot-product
instructions found in the assembly. Not wired into the engine yet (bench/NOTES.md).
Usage: python bench/int8_gemv.py
"""
import collections
import os
import re
import sys
import time

import numpy as np
from llvmlite import ir
from numba import float32, njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from tinypaged.kernels.cpu.common import N_CHUNKS, f16_bits_to_f32  # noqa: E402
from tinypaged.kernels.cpu.quantized import gemv_packed  # noqa: E402
from tinypaged.model.ggml_quant import Q4_1  # noqa: E402
from tinypaged.model.packed import PackedWeight  # noqa: E402


def _ptr(context, builder, arrty, arr, off):
    """The address of element `off` of a C-contiguous array (flat index)."""
    a = context.make_array(arrty)(context, builder, arr)
    return builder.gep(a.data, [off])


@intrinsic
def dot32_nibbles(typingctx, q, qoff, x, xoff, high):
    """sum over j < 32 of nibble(q[qoff + j]) * x[xoff + j]; nibble = low 4 bits, or high
    4 bits if high. q: uint8 1-D/2-D C array (flat offset), x: int8."""
    sig = types.int32(q, types.intp, x, types.intp, types.boolean)

    def codegen(context, builder, signature, args):
        qarr, qo, xarr, xo, hi = args
        v32 = ir.VectorType(ir.IntType(8), 32)
        qp = builder.bitcast(_ptr(context, builder, signature.args[0], qarr, qo), v32.as_pointer())
        xp = builder.bitcast(_ptr(context, builder, signature.args[2], xarr, xo), v32.as_pointer())
        qv = builder.load(qp, align=1)
        xv = builder.load(xp, align=1)
        lo = builder.and_(qv, ir.Constant(v32, [15] * 32))
        up = builder.lshr(qv, ir.Constant(v32, [4] * 32))
        nib = builder.select(hi, up, lo)
        v32i = ir.VectorType(ir.IntType(32), 32)
        prod = builder.mul(builder.zext(nib, v32i), builder.sext(xv, v32i))
        mod = builder.module
        fn = cgutils.get_or_insert_function(mod, ir.FunctionType(ir.IntType(32), [v32i]),
                                            "llvm.vector.reduce.add.v32i32")
        return builder.call(fn, [prod])
    return sig, codegen


@njit(parallel=True, fastmath=True)
def gemv_q41_int8(xq, dx, sx, quants, scales, mins, out):
    """xq (K,) int8 quantized per 32-block with scales dx (K/32,), sx (K/32,) block sums of x."""
    n_out, half = quants.shape
    upper = half >> 5
    flat = quants.reshape(-1)
    per_chunk = -(-n_out // N_CHUNKS)
    for c in prange(N_CHUNKS):
        for n in range(c * per_chunk, min(n_out, (c + 1) * per_chunk)):
            acc = float32(0.0)
            base = n * half
            for b in range(upper):
                dl = dot32_nibbles(flat, base + b * 32, xq, b * 32, False)
                dh = dot32_nibbles(flat, base + b * 32, xq, half + b * 32, True)
                acc += (f16_bits_to_f32(scales[n, b]) * dx[b] * float32(dl)
                        + f16_bits_to_f32(mins[n, b]) * sx[b]
                        + f16_bits_to_f32(scales[n, upper + b]) * dx[upper + b] * float32(dh)
                        + f16_bits_to_f32(mins[n, upper + b]) * sx[upper + b])
            out[0, n] = acc


def quantize_x(x):
    """x (K,) -> int8 per 32-block (round to nearest), the blocks' scales and sums."""
    blocks = x.reshape(-1, 32)
    amax = np.abs(blocks).max(1)
    d = (amax / 127).astype(np.float32)
    q = np.round(blocks / np.where(d == 0, 1, d)[:, None]).astype(np.int8)
    return q.reshape(-1), d, blocks.sum(1).astype(np.float32)


def bench(f, reps=200) -> float:
    """Microseconds a call, after one warm-up call."""
    f()
    t = time.perf_counter()
    for _ in range(reps):
        f()
    return (time.perf_counter() - t) / reps * 1e6


def main() -> None:
    rng = np.random.default_rng(0)
    for (N, K) in [(576, 576), (1536, 576), (576, 1536), (49152, 576)]:
        w = PackedWeight.quantize(rng.standard_normal((N, K)).astype(np.float32), Q4_1)
        x = rng.standard_normal((1, K)).astype(np.float32)
        xq, dx, sx = quantize_x(x[0])
        o = np.empty((1, N), np.float32)
        reps = 20 if N > 10000 else 300
        t0 = bench(lambda: gemv_packed(x, w), reps)
        t1 = bench(lambda: gemv_q41_int8(xq, dx, sx, w.quants, w.scales, w.mins, o), reps)
        tq = bench(lambda: quantize_x(x[0]), reps)
        ref = x.astype(np.float64) @ w.dequantize().T.astype(np.float64)
        rel = np.abs(o - ref).max() / np.abs(ref).max()
        print(f"{N}x{K}: float {t0:.0f} us, int8 {t1:.0f} us (+ quantize x {tq:.0f} us "
              f"in numpy); max error / max |y| {rel:.1e}")
    lib = gemv_q41_int8.overloads[gemv_q41_int8.signatures[0]].library
    asm = lib.get_asm_str()
    ops = collections.Counter(re.findall(r"^\s+(v\w+)", asm, re.M))
    wanted = ("dpbusd", "pmaddubs", "pmaddwd", "pmovzx", "pmovsx", "pmulld")
    print("integer dot-product instructions:",
          {k: v for k, v in ops.items() if any(w in k for w in wanted)})


if __name__ == "__main__":
    main()
