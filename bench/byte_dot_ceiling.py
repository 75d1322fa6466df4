"""The CPU's ceiling for the packed products: independent 512-bit vpdpbusd (AVX-512
VNNI: 64 byte products a lane group) in a loop, nothing else, on one core. The packed
GEMM's rate against this figure says how much of a block's loop goes to work other
than the integer dots (unpacking, the epilogue, spills): bench/NOTES.md.

Then the same loop shaped as the GEMM's wide pass (16 rows of x, a block's 8 chunks a
row), with the float epilogue LANES.md's contract gives each row's block: none, or
cvt + mul + fma + fma (the min kinds and Q4_K, Q5_K), where the products lose what the
float ops take of the vector pipes vpdpbusd runs on.

Usage: python bench/byte_dot_ceiling.py     (prints G instructions/s and GMAC/s a core)
"""
from __future__ import annotations

import os
import sys
import time

from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from tinypaged.kernels.cpu.common import HAS_VNNI  # noqa: E402

INTS = ir.VectorType(ir.IntType(32), 16)
MACS = 64  # byte products one vpdpbusd adds


def _jitted(loop):
    """A jitted function(n) whose body is loop(builder, n) (IR; it returns an i64)."""
    @intrinsic
    def spin(typingctx, n):
        def codegen(context, builder, signature, args):
            return loop(builder, args[0])
        return types.int64(types.int64), codegen

    @njit
    def run(n):
        return spin(n)
    return run


def _vpdpbusd(builder):
    return cgutils.get_or_insert_function(builder.module, ir.FunctionType(INTS, [INTS] * 3),
                                          "llvm.x86.avx512.vpdpbusd.512")


def spinner(chains: int):
    """A jitted function(n): n rounds of `chains` independent vpdpbusd."""
    def loop(builder, n):
        dot = _vpdpbusd(builder)
        sums = [cgutils.alloca_once_value(builder, ir.Constant(INTS, [k] * 16)) for k in range(chains)]
        w, x = ir.Constant(INTS, [0x01020304] * 16), ir.Constant(INTS, [0x01010101] * 16)
        with cgutils.for_range(builder, n):
            # (x through an empty asm: LLVM cannot fold the constant products away)
            opaque = builder.asm(ir.FunctionType(INTS, [INTS]), "", "=v,0", [x], True)
            for total in sums:
                builder.store(builder.call(dot, [builder.load(total), w, opaque]), total)
        result = builder.load(sums[0])
        for total in sums[1:]:
            result = builder.add(result, builder.load(total))
        return builder.sext(builder.extract_element(result, ir.Constant(ir.IntType(32), 0)), ir.IntType(64))
    return _jitted(loop)


def block_spinner(rows: int, epilogue: str):
    """A jitted function(n): n blocks of `rows` rows' 8 chained vpdpbusd each, then each
    row's epilogue: "add" acc += float(dot); "min" (Q4_K's) acc = fma(dx, fma(low, qsum,
    scale * float(dot)), acc); "q6" (Q6_K's: the 8 dots in two halves) acc = fma(dx, d *
    fma(float(S0 - X0), s0, float(S1 - X1) * s1), acc)."""
    floats = ir.VectorType(ir.FloatType(), 16)

    def loop(builder, n):
        dot = _vpdpbusd(builder)
        fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(floats, [floats] * 3),
                                             "llvm.fma.v16f32")
        totals = [cgutils.alloca_once_value(builder, ir.Constant(floats, [0.0] * 16)) for _ in range(rows)]
        x, scale = ir.Constant(INTS, [0x01010101] * 16), ir.Constant(floats, [0.5] * 16)
        with cgutils.for_range(builder, n):
            opaque = builder.asm(ir.FunctionType(INTS, [INTS]), "", "=v,0", [x], True)
            for r, total in enumerate(totals):  # (a weight of its own a row: no common work)
                halves = [ir.Constant(INTS, [0] * 16)] * 2
                for c in range(8):
                    h = c // 4 if epilogue == "q6" else 0
                    w = ir.Constant(INTS, [0x01020304 + 2 * r + h] * 16)  # (no two chains alike)
                    halves[h] = builder.call(dot, [halves[h], w, opaque])
                if epilogue == "q6":
                    centred = [builder.sitofp(builder.sub(half, opaque), floats) for half in halves]
                    term = builder.call(fma, [centred[0], scale, builder.fmul(centred[1], scale)])
                    term = builder.call(fma, [scale, builder.fmul(scale, term), builder.load(total)])
                elif epilogue == "min":
                    term = builder.call(fma, [scale, scale, builder.fmul(scale, builder.sitofp(halves[0], floats))])
                    term = builder.call(fma, [scale, term, builder.load(total)])
                else:
                    term = builder.fadd(builder.sitofp(halves[0], floats), builder.load(total))
                builder.store(term, total)
        result = builder.load(totals[0])
        for total in totals[1:]:
            result = builder.fadd(result, builder.load(total))
        return builder.fptosi(builder.extract_element(result, ir.Constant(ir.IntType(32), 0)), ir.IntType(64))
    return _jitted(loop)


def main() -> None:
    if not HAS_VNNI:
        sys.exit("this CPU has no AVX-512 VNNI: the lanes kernels take AVX2's or the generic dot here")
    rounds = 50_000_000
    print("| independent chains | G vpdpbusd/s | GMAC/s a core |\n|---|---|---|")
    for chains in (4, 8, 12):
        run = spinner(chains)
        run(10)
        best = min(_timed(run, rounds) for _ in range(3))
        rate = rounds * chains / best
        print(f"| {chains} | {rate / 1e9:.2f} | {rate * MACS / 1e9:.0f} |")
    print("\n| a block of 16 rows, each | G vpdpbusd/s | GMAC/s a core |\n|---|---|---|")
    for epilogue, what in (("add", "8 vpdpbusd, a convert and an add"),
                           ("min", "8 vpdpbusd, a convert, a mul and two fma (Q4_K)"),
                           ("q6", "8 vpdpbusd, two subs, two converts, two muls, two fma (Q6_K)")):
        run = block_spinner(16, epilogue)
        run(10)
        blocks = rounds // 16
        best = min(_timed(run, blocks) for _ in range(3))
        rate = blocks * 16 * 8 / best
        print(f"| {what} | {rate / 1e9:.2f} | {rate * MACS / 1e9:.0f} |")


def _timed(run, rounds: int) -> float:
    started = time.perf_counter()
    run(rounds)
    return time.perf_counter() - started


if __name__ == "__main__":
    main()
