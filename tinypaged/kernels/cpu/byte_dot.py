"""The lanes kernels' integer step, in LLVM IR: 16 int32 lanes, each summing the dots
of 4 bytes of W with 4 int8 values of x (the same 4 in every lane), chunk after
chunk of a block.

With AVX-512 VNNI a chunk is one vpdpbusd. With AVX2 (laptops, AMD Zen 2, what
llama.cpp's AVX2 build runs) it is, on each 256-bit half, vpmaddubsw: unsigned
bytes times int8, pairs summed into int16 with saturation. Those int16 sums are
added up over as many chunks as cannot overflow (|x| <= 127, so a pair is at most
2 * 127 * max(w)), then vpmaddwd by ones turns them into int32: the same integers
as vpdpbusd's. Q8_0's bytes go in signed, as |w| times vpsignb(x, w), not as
w + 128 (which would saturate).

Elsewhere ("generic": other CPUs, or numba compiling for a CPU named by
NUMBA_CPU_NAME) the bytes are widened to int32, multiplied and summed by fours in
plain LLVM vectors, which every target lowers: the same integers again, Q8_0's
signed bytes as they are.
"""
from llvmlite import ir
from numba.core import cgutils

from .common import HAS_AVX2, HAS_VNNI
from .vector_ir import IR_I32, INTS, LANES, mask

LANES_ISA = "vnni" if HAS_VNNI else "avx2" if HAS_AVX2 else "generic"
_BYTES = ir.VectorType(ir.IntType(8), 32)
_SHORTS = ir.VectorType(ir.IntType(16), 16)
_X_MAX = 127  # |x|: activations rounded to int8 by their block's largest


def signed_bytes_direct() -> bool:
    """Whether Q8_0's signed bytes go to BlockDot as they are (AVX2, generic), not as
    q + 128."""
    return LANES_ISA != "vnni"


def _function(builder, name, result, *operands):
    return cgutils.get_or_insert_function(builder.module, ir.FunctionType(result, list(operands)), name)


class BlockDot:
    """The running int32 dots (16 lanes, or 8: half a group, AVX2 only) of one row of
    x with a group's chunks. w_max: the largest byte W can hold (|q| for signed Q8_0
    bytes); start: where the dots start (width x i32; None: at zero)."""

    def __init__(self, builder, w_max: int, signed: bool = False, width: int = LANES, start=None):
        assert width == LANES or LANES_ISA == "avx2"
        self.builder, self.signed, self.width = builder, signed, width
        self.total = ir.Constant(ir.VectorType(IR_I32, width), [0] * width) if start is None else start
        self.per_flush = (2 ** 15 - 1) // (2 * _X_MAX * w_max)  # chunks int16 can hold
        self.pending, self.count = None, 0

    def add(self, w, x_quad):
        """+ the 4-byte dots of w (width x i32: 4 bytes a lane) with x_quad (width x
        i32, the same 4 int8 bytes in each)."""
        builder = self.builder
        if LANES_ISA == "vnni":
            dpbusd = _function(builder, "llvm.x86.avx512.vpdpbusd.512", INTS, INTS, INTS, INTS)
            self.total = builder.call(dpbusd, [self.total, w, x_quad])
            return
        if LANES_ISA == "generic":
            self.total = builder.add(self.total, self._widened_dots(w, x_quad))
            return
        pairs = _function(builder, "llvm.x86.avx2.pmadd.ub.sw", _SHORTS, _BYTES, _BYTES)
        w_bytes = builder.bitcast(w, ir.VectorType(ir.IntType(8), 4 * self.width))
        x_bytes = builder.bitcast(builder.shuffle_vector(x_quad, x_quad, mask(range(8))), _BYTES)
        sums = []
        for h in range(self.width // 8):
            w_half = builder.shuffle_vector(w_bytes, w_bytes, mask(range(32 * h, 32 * h + 32)))
            x_half = x_bytes
            if self.signed:  # w x = |w| (x with w's sign); |-128| is 128 read unsigned
                sign = _function(builder, "llvm.x86.avx2.psign.b", _BYTES, _BYTES, _BYTES)
                absolute = _function(builder, "llvm.abs.v32i8", _BYTES, _BYTES, ir.IntType(1))
                x_half = builder.call(sign, [x_half, w_half])
                w_half = builder.call(absolute, [w_half, ir.Constant(ir.IntType(1), 0)])
            sums.append(builder.call(pairs, [w_half, x_half]))
        chunk = sums[0] if len(sums) == 1 else builder.shuffle_vector(sums[0], sums[1], mask(range(2 * LANES)))
        self.pending = chunk if self.pending is None else builder.add(self.pending, chunk)
        self.count += 1
        if self.count == self.per_flush:
            self._flush()

    def _widened_dots(self, w, x_quad):
        """16 lanes of sum_t w[4j + t] * x[t], in int32: bytes widened (w unsigned, or
        signed for Q8_0; x signed), multiplied, and the 4 products of a lane added."""
        builder, wide = self.builder, ir.VectorType(IR_I32, 4 * LANES)
        w_bytes = builder.bitcast(w, ir.VectorType(ir.IntType(8), 4 * LANES))
        x_bytes = builder.bitcast(x_quad, ir.VectorType(ir.IntType(8), 4 * LANES))
        w_wide = builder.sext(w_bytes, wide) if self.signed else builder.zext(w_bytes, wide)
        products = builder.mul(w_wide, builder.sext(x_bytes, wide))
        parts = [builder.shuffle_vector(products, products, mask(4 * j + t for j in range(LANES)))
                 for t in range(4)]
        return builder.add(builder.add(parts[0], parts[1]), builder.add(parts[2], parts[3]))

    def zero_pending(self):
        """What resume takes at the start of a block (AVX2: int16 sums of no chunk)."""
        return ir.Constant(_SHORTS, [0] * 16)

    def resume(self, pending):
        """Carries on from int16 sums kept across a loop over chunks (AVX2, width 8,
        weights of 4 bits: 8 chunks never overflow, so no flush inside the loop)."""
        assert self.width == 8 and self.per_flush >= 8
        self.pending, self.count = pending, 0

    def _flush(self):
        builder = self.builder
        widen = _function(builder, "llvm.x86.avx2.pmadd.wd", ir.VectorType(IR_I32, 8), _SHORTS, _SHORTS)
        ones = ir.Constant(_SHORTS, [1] * 16)
        quads = [builder.call(widen, [builder.shuffle_vector(self.pending, self.pending,
                                                             mask(range(16 * h, 16 * h + 16))), ones])
                 for h in range(self.width // 8)]
        wide = quads[0] if len(quads) == 1 else builder.shuffle_vector(quads[0], quads[1], mask(range(LANES)))
        self.total = builder.add(self.total, wide)
        self.pending, self.count = None, 0

    def result(self):
        """The 16 int32 dots of every chunk added so far."""
        if self.pending is not None:
            self._flush()
        return self.total
