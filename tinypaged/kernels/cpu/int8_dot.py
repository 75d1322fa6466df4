"""Integer dot products of one 32-weight block with 32 int8 activations, written as
LLVM IR so that LLVM picks the CPU's own instruction for them.

numba's loops over int8 arrays stay scalar (it types int8 * int8 as int64, and its
LLVM does not vectorize that widen, multiply, reduce pattern). Written here as
whole vectors (load 32 bytes, zero-extend the weights, sign-extend the
activations, multiply, reduce-add), LLVM emits vpdpbusd on this AVX-512 VNNI CPU;
the IR names no CPU feature, so elsewhere LLVM picks that CPU's own instructions
(bench/int8_gemv.py prints what it finds in the assembly; measured here only).

Each function returns sum over j < 32 of u[j] * x[xoff + j] (int32, exact), where
u is an unsigned byte taken from q[qoff + j]:
    dot32_low     u = q & 15          (Q4_x: the low nibble, weights 0 .. K/2 - 1)
    dot32_high    u = q >> 4          (Q4_x: the high nibble, weights K/2 .. K - 1)
    dot32_biased  u = q xor 128       (Q8_0: the signed byte plus 128, so
                                       q . x = dot32_biased - 128 * sum(x))
The unsigned-times-signed form is the one the dot-product instructions take.

dot32_bits returns sum over j < 32 of bit j * x[xoff + j], the bits being the 4
bytes at q[qoff] little-endian (Q5_x's fifth bits: model/packed.py): the bits
become bytes of 0 or 1 (a mask move on AVX-512) for the same multiply-add.
"""
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

_BYTES = ir.VectorType(ir.IntType(8), 32)
_WORDS = ir.VectorType(ir.IntType(32), 32)


def _address(context, builder, array_type, array, offset):
    """The address of element `offset` of a C-contiguous array, counted flat."""
    data = context.make_array(array_type)(context, builder, array).data
    return builder.bitcast(builder.gep(data, [offset]), _BYTES.as_pointer())


def _block_dot(unsigned_bytes):
    """An intrinsic (q, qoff, x, xoff) -> int32 for one way of reading q's bytes."""
    def typer(typingctx, q, qoff, x, xoff):
        if not (isinstance(q, types.Array) and q.layout == "C" and q.dtype.bitwidth == 8
                and isinstance(x, types.Array) and x.layout == "C" and x.dtype == types.int8):
            return None
        signature = types.int32(q, types.intp, x, types.intp)

        def codegen(context, builder, sig, args):
            q_arr, q_off, x_arr, x_off = args
            qv = builder.load(_address(context, builder, sig.args[0], q_arr, q_off), align=1)
            xv = builder.load(_address(context, builder, sig.args[2], x_arr, x_off), align=1)
            products = builder.mul(builder.zext(unsigned_bytes(builder, qv), _WORDS),
                                   builder.sext(xv, _WORDS))
            reduce_add = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(ir.IntType(32), [_WORDS]),
                "llvm.vector.reduce.add.v32i32")
            return builder.call(reduce_add, [products])
        return signature, codegen
    return intrinsic(typer)


def _splat(value: int) -> ir.Constant:
    return ir.Constant(_BYTES, [value] * 32)


dot32_low = _block_dot(lambda builder, q: builder.and_(q, _splat(15)))
dot32_high = _block_dot(lambda builder, q: builder.lshr(q, _splat(4)))
dot32_biased = _block_dot(lambda builder, q: builder.xor(q, _splat(128)))


@intrinsic
def dot32_bits(typingctx, bits, boff, x, xoff):
    """(bits, boff, x, xoff) -> int32: see the module docstring."""
    if not (isinstance(bits, types.Array) and bits.layout == "C" and bits.dtype == types.uint8
            and isinstance(x, types.Array) and x.layout == "C" and x.dtype == types.int8):
        return None
    signature = types.int32(bits, types.intp, x, types.intp)

    def codegen(context, builder, sig, args):
        b_arr, b_off, x_arr, x_off = args
        data = context.make_array(sig.args[0])(context, builder, b_arr).data
        word = builder.load(builder.bitcast(builder.gep(data, [b_off]), ir.IntType(32).as_pointer()),
                            align=1)
        mask = builder.bitcast(word, ir.VectorType(ir.IntType(1), 32))
        xv = builder.load(_address(context, builder, sig.args[2], x_arr, x_off), align=1)
        products = builder.mul(builder.zext(mask, _WORDS), builder.sext(xv, _WORDS))
        reduce_add = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(ir.IntType(32), [_WORDS]), "llvm.vector.reduce.add.v32i32")
        return builder.call(reduce_add, [products])
    return signature, codegen
