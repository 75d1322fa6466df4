"""The CPU's ceiling for the packed products: independent 512-bit vpdpbusd (AVX-512
VNNI: 64 byte products a lane group) in a loop, nothing else, on one core. The packed
GEMM's rate against this figure says how much of a block's loop goes to work other
than the integer dots (unpacking, the epilogue, spills): bench/NOTES.md.

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


def spinner(chains: int):
    """A jitted function(n): n rounds of `chains` independent vpdpbusd."""
    @intrinsic
    def spin(typingctx, n):
        def codegen(context, builder, signature, args):
            dot = cgutils.get_or_insert_function(builder.module, ir.FunctionType(INTS, [INTS] * 3),
                                                 "llvm.x86.avx512.vpdpbusd.512")
            sums = [cgutils.alloca_once_value(builder, ir.Constant(INTS, [k] * 16)) for k in range(chains)]
            w, x = ir.Constant(INTS, [0x01020304] * 16), ir.Constant(INTS, [0x01010101] * 16)
            with cgutils.for_range(builder, args[0]):
                # (x through an empty asm: LLVM cannot fold the constant products away)
                opaque = builder.asm(ir.FunctionType(INTS, [INTS]), "", "=v,0", [x], True)
                for total in sums:
                    builder.store(builder.call(dot, [builder.load(total), w, opaque]), total)
            result = builder.load(sums[0])
            for total in sums[1:]:
                result = builder.add(result, builder.load(total))
            return builder.sext(builder.extract_element(result, ir.Constant(ir.IntType(32), 0)),
                                ir.IntType(64))
        return types.int64(types.int64), codegen

    @njit
    def run(n):
        return spin(n)
    return run


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


def _timed(run, rounds: int) -> float:
    started = time.perf_counter()
    run(rounds)
    return time.perf_counter() - started


if __name__ == "__main__":
    main()
