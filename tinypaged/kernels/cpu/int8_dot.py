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

dot32_low5 and dot32_high5 take Q5_x's fifth bits too, (q, qoff, bits, boff, x,
xoff): u = the nibble + 16 * bit j of the 4 bytes at bits[boff] (little-endian;
model/packed.py), so a Q5 block costs one multiply-add and one sum, as a Q4 block.

dot32_q6_low and dot32_q6_high take Q6_K's blocks, (q, qoff, tops, toff, sa, sb, x,
xoff): q = the nibble + 16 * the two bits of the 8 bytes at tops[toff] (bits 2t,
2t + 1 of byte i for weight 4i + t), and return the block's exact integer
    sa * sum_{j < 16} (q_j - 32) x_j  +  sb * sum_{16 <= j < 32} (q_j - 32) x_j
with the int8 sub-scales sa and sb of its two halves (below 2^24 in magnitude:
2 * 128 * 32 * 16 * 127), so a block still gives one integer and one float term.
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


def _dot(builder, unsigned, signed):
    """sum over j < 32 of unsigned[j] * signed[j] (two vectors of 32 bytes), int32."""
    products = builder.mul(builder.zext(unsigned, _WORDS), builder.sext(signed, _WORDS))
    reduce_add = cgutils.get_or_insert_function(
        builder.module, ir.FunctionType(ir.IntType(32), [_WORDS]), "llvm.vector.reduce.add.v32i32")
    return builder.call(reduce_add, [products])


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
            return _dot(builder, unsigned_bytes(builder, qv), xv)
        return signature, codegen
    return intrinsic(typer)


def _splat(value: int) -> ir.Constant:
    return ir.Constant(_BYTES, [value] * 32)


def _block_dot_with_bits(nibble):
    """An intrinsic (q, qoff, bits, boff, x, xoff) -> int32: nibble(q) + 16 * bit."""
    def typer(typingctx, q, qoff, bits, boff, x, xoff):
        if not (isinstance(q, types.Array) and q.layout == "C" and q.dtype == types.uint8
                and isinstance(bits, types.Array) and bits.layout == "C" and bits.dtype == types.uint8
                and isinstance(x, types.Array) and x.layout == "C" and x.dtype == types.int8):
            return None
        signature = types.int32(q, types.intp, bits, types.intp, x, types.intp)

        def codegen(context, builder, sig, args):
            q_arr, q_off, b_arr, b_off, x_arr, x_off = args
            qv = builder.load(_address(context, builder, sig.args[0], q_arr, q_off), align=1)
            data = context.make_array(sig.args[2])(context, builder, b_arr).data
            word = builder.load(builder.bitcast(builder.gep(data, [b_off]),
                                                ir.IntType(32).as_pointer()), align=1)
            fifth = builder.shl(builder.zext(builder.bitcast(word, ir.VectorType(ir.IntType(1), 32)),
                                             _BYTES), _splat(4))
            unsigned = builder.or_(nibble(builder, qv), fifth)
            xv = builder.load(_address(context, builder, sig.args[4], x_arr, x_off), align=1)
            return _dot(builder, unsigned, xv)
        return signature, codegen
    return intrinsic(typer)


dot32_low = _block_dot(lambda builder, q: builder.and_(q, _splat(15)))
dot32_high = _block_dot(lambda builder, q: builder.lshr(q, _splat(4)))
dot32_biased = _block_dot(lambda builder, q: builder.xor(q, _splat(128)))
dot32_low5 = _block_dot_with_bits(lambda builder, q: builder.and_(q, _splat(15)))
dot32_high5 = _block_dot_with_bits(lambda builder, q: builder.lshr(q, _splat(4)))


def _block_dot_q6(nibble):
    """An intrinsic (q, qoff, tops, toff, sa, sb, x, xoff) -> int32 (see the docstring)."""
    def typer(typingctx, q, qoff, tops, toff, sa, sb, x, xoff):
        if not (isinstance(q, types.Array) and q.layout == "C" and q.dtype == types.uint8
                and isinstance(tops, types.Array) and tops.layout == "C" and tops.dtype == types.uint8
                and isinstance(x, types.Array) and x.layout == "C" and x.dtype == types.int8):
            return None
        signature = types.int32(q, types.intp, tops, types.intp, types.int32, types.int32, x,
                                types.intp)

        def codegen(context, builder, sig, args):
            q_arr, q_off, t_arr, t_off, sa, sb, x_arr, x_off = args
            qv = builder.load(_address(context, builder, sig.args[0], q_arr, q_off), align=1)
            data = context.make_array(sig.args[2])(context, builder, t_arr).data
            eight = builder.load(builder.bitcast(builder.gep(data, [t_off]),
                                                 ir.VectorType(ir.IntType(8), 8).as_pointer()), align=1)
            spread = builder.shuffle_vector(eight, eight, ir.Constant(
                ir.VectorType(ir.IntType(32), 32), [j // 4 for j in range(32)]))
            shifts = ir.Constant(_BYTES, [2 * (j % 4) for j in range(32)])
            tops = builder.shl(builder.and_(builder.lshr(spread, shifts), _splat(3)), _splat(4))
            weights = builder.sub(builder.or_(nibble(builder, qv), tops), _splat(32))  # -32 .. 31
            xv = builder.load(_address(context, builder, sig.args[6], x_arr, x_off), align=1)
            products = builder.mul(builder.sext(weights, _WORDS), builder.sext(xv, _WORDS))
            halves = ir.VectorType(ir.IntType(32), 16)
            reduce_add = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(ir.IntType(32), [halves]), "llvm.vector.reduce.add.v16i32")
            first = builder.call(reduce_add, [builder.shuffle_vector(
                products, products, ir.Constant(halves, list(range(16))))])
            second = builder.call(reduce_add, [builder.shuffle_vector(
                products, products, ir.Constant(halves, list(range(16, 32))))])
            return builder.add(builder.mul(sa, first), builder.mul(sb, second))
        return signature, codegen
    return intrinsic(typer)


dot32_q6_low = _block_dot_q6(lambda builder, q: builder.and_(q, _splat(15)))
dot32_q6_high = _block_dot_q6(lambda builder, q: builder.lshr(q, _splat(4)))
