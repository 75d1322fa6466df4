"""Activations rounded to int8 per 32-block, for products with packed weights.

A packed weight multiplies x rounded as llama.cpp rounds it:
per block of 32 values, d = max|x| / 127 and q = round-half-even(x / d) in int8, so
x is taken as d * q. The kernels then compute each block's dot product in
integers (lanes_product.py); the NumPy spec is
reference.quantize_activations / round_activations.

The rounding must equal the NumPy spec bit for bit. numba's own loops over a block
stay scalar (32 max, multiply and convert steps, unrolled), so each block's two
passes are written as whole vectors in LLVM IR: the largest |x| (a max is exact in
any order) and the round-half-even of x times the inverse scale (llvm.rint, in the
default rounding mode, as np.rint). Cost: one pass over x.
"""
import numpy as np
from llvmlite import ir
from numba import float32, types
from numba.core import cgutils
from numba.extending import intrinsic

from ...formats.quant_kind import QK  # activations a scale, as the weights' blocks
from ...jit_cache import cached_njit

_MAX_Q = float32(127.0)
_FLOATS = ir.VectorType(ir.FloatType(), QK)


def _block_pointer(context, builder, array_type, array, offset, element):
    data = context.make_array(array_type)(context, builder, array).data
    return builder.bitcast(builder.gep(data, [offset]), ir.VectorType(element, QK).as_pointer())


@intrinsic
def _block_abs_max(typingctx, x, at):
    """max |x[at .. at + 31]| (x flat float32). The |x|'s bits are compared as unsigned
    integers, which order non-negative floats as their values do (a NaN above all):
    LLVM's float max reduction keeps NaN's rules one lane after another, a chain of
    16 steps that took half of the rounding's time."""
    def codegen(context, builder, sig, args):
        values = builder.load(_block_pointer(context, builder, sig.args[0], args[0], args[1],
                                             ir.FloatType()), align=4)
        fabs = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_FLOATS, [_FLOATS]),
                                              "llvm.fabs.v32f32")
        words = ir.VectorType(ir.IntType(32), QK)
        umax = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.IntType(32), [words]),
                                              "llvm.vector.reduce.umax.v32i32")
        largest = builder.call(umax, [builder.bitcast(builder.call(fabs, [values]), words)])
        return builder.bitcast(largest, ir.FloatType())
    return types.float32(x, types.intp), codegen


@intrinsic
def _round_block(typingctx, x, at, inverse, q):
    """q[at + j] = int8(rint(x[at + j] * inverse)) for j < 32; returns their sum."""
    def codegen(context, builder, sig, args):
        x_arr, at, inverse, q_arr = args
        values = builder.load(_block_pointer(context, builder, sig.args[0], x_arr, at,
                                             ir.FloatType()), align=4)
        one = builder.insert_element(ir.Constant(_FLOATS, None), inverse, ir.Constant(ir.IntType(32), 0))
        splat = builder.shuffle_vector(one, ir.Constant(_FLOATS, None),
                                       ir.Constant(ir.VectorType(ir.IntType(32), QK), [0] * QK))
        rint = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_FLOATS, [_FLOATS]),
                                              "llvm.rint.v32f32")
        rounded = builder.call(rint, [builder.fmul(values, splat)])
        q8 = builder.fptosi(rounded, ir.VectorType(ir.IntType(8), QK))
        builder.store(q8, _block_pointer(context, builder, sig.args[3], q_arr, at, ir.IntType(8)), align=1)
        words = ir.VectorType(ir.IntType(32), QK)
        add = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.IntType(32), [words]),
                                             "llvm.vector.reduce.add.v32i32")
        return builder.call(add, [builder.sext(q8, words)])
    return types.int32(x, types.intp, types.float32, q), codegen


@cached_njit(inline="always")
def quantize_row(values, at, width, q, d, qsum):
    """Rounds x's row at flat `values[at .. at + width - 1]` (width a multiple of 32):
    q (width,) int8 values, d (width/32,) float32 scales, qsum (width/32,) int32 sums."""
    for b in range(width // QK):
        amax = _block_abs_max(values, at + b * QK)
        scale = float32(amax / _MAX_Q)  # (numba divides float32s in float64: round once)
        inverse = float32(float32(1.0) / scale) if scale > 0 else float32(0.0)
        d[b] = scale
        qsum[b] = _round_block(values[at:], b * QK, inverse, q)


@cached_njit()
def quantize_activations(x, padded_rows):
    """x (M, K) float32, K a multiple of 32 -> q (R, K) int8, d (R, K/32) float32 (the
    blocks' scales), qsum (R, K/32) int32 (each block's sum of q), R = max(M,
    padded_rows): rows after M are zeros (kernels that take rows 8 at a time)."""
    n_rows, width = x.shape
    n_blocks = width // QK
    rows = max(n_rows, padded_rows)
    q = np.zeros((rows, width), dtype=np.int8)
    d = np.zeros((rows, n_blocks), dtype=np.float32)
    qsum = np.zeros((rows, n_blocks), dtype=np.int32)
    values = np.ascontiguousarray(x).reshape(-1)
    for m in range(n_rows):
        quantize_row(values, m * width, width, q[m], d[m], qsum[m])
    return q, d, qsum
