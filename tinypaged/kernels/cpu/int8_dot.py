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
formats/packed.py), so a Q5 block costs one multiply-add and one sum, as a Q4 block.

dot32_q6_low and dot32_q6_high take Q6_K's blocks, (q, qoff, tops, toff, sa, sb, x,
xoff): q = the nibble + 16 * bit j of the 4 bytes at tops[toff] + 32 * bit j of the
4 bytes after them (formats/packed.py), and return the block's exact integer
    sa * sum_{j < 16} (q_j - 32) x_j  +  sb * sum_{16 <= j < 32} (q_j - 32) x_j
with the int8 sub-scales sa and sb of its two halves (below 2^24 in magnitude:
2 * 128 * 32 * 16 * 127), so a block still gives one integer and one float term.
With AVX-512 VNNI they name vpdpbusd (a 256-bit one for each half's four lanes);
elsewhere they are generic IR (Q6_DOTS has both; the tests hold them equal).
"""
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from .common import HAS_VNNI

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


def _q6_values(context, builder, sig, args, nibble):
    """Q6_K's q (32 bytes, 0 .. 63) of one block and x's 32 bytes, from the arguments
    (q, qoff, tops, toff, sa, sb, x, xoff)."""
    q_arr, q_off, t_arr, t_off, _, _, x_arr, x_off = args
    qv = builder.load(_address(context, builder, sig.args[0], q_arr, q_off), align=1)
    data = context.make_array(sig.args[2])(context, builder, t_arr).data
    u = nibble(builder, qv)
    for plane in range(2):  # bits 4 and 5 of q, 32 bits each
        at = builder.add(t_off, ir.Constant(t_off.type, 4 * plane))
        word = builder.load(builder.bitcast(builder.gep(data, [at]), ir.IntType(32).as_pointer()),
                            align=1)
        bits = builder.zext(builder.bitcast(word, ir.VectorType(ir.IntType(1), 32)), _BYTES)
        u = builder.or_(u, builder.shl(bits, _splat(4 + plane)))
    return u, builder.load(_address(context, builder, sig.args[6], x_arr, x_off), align=1)


def _q6_generic(context, builder, sig, args, nibble):
    """Any CPU: (q - 32) * x widened to int32, times each half's scale, one sum."""
    u, xv = _q6_values(context, builder, sig, args, nibble)
    sa, sb = args[4], args[5]
    products = builder.mul(builder.sext(builder.sub(u, _splat(32)), _WORDS), builder.sext(xv, _WORDS))
    scales = ir.Constant(_WORDS, None)
    for j in range(32):
        scales = builder.insert_element(scales, sa if j < 16 else sb, ir.Constant(ir.IntType(32), j))
    reduce_add = cgutils.get_or_insert_function(
        builder.module, ir.FunctionType(ir.IntType(32), [_WORDS]), "llvm.vector.reduce.add.v32i32")
    return builder.call(reduce_add, [builder.mul(products, scales)])


def _q6_vnni(context, builder, sig, args, nibble):
    """AVX-512 VNNI: one vpdpbusd gives q . x in 8 lanes of 4 columns, one more 32 * x
    in the same lanes; their difference times [sa] * 4 + [sb] * 4, one sum of 8."""
    u, xv = _q6_values(context, builder, sig, args, nibble)
    sa, sb = args[4], args[5]
    lanes = ir.VectorType(ir.IntType(32), 8)
    dpbusd = cgutils.get_or_insert_function(builder.module, ir.FunctionType(lanes, [lanes] * 3),
                                            "llvm.x86.avx512.vpdpbusd.256")
    zero = ir.Constant(lanes, [0] * 8)
    x_words = builder.bitcast(xv, lanes)
    dots = builder.call(dpbusd, [zero, builder.bitcast(u, lanes), x_words])
    offsets = builder.call(dpbusd, [zero, builder.bitcast(_splat(32), lanes), x_words])
    scales = ir.Constant(lanes, None)
    for j in range(8):
        scales = builder.insert_element(scales, sa if j < 4 else sb, ir.Constant(ir.IntType(32), j))
    reduce_add = cgutils.get_or_insert_function(
        builder.module, ir.FunctionType(ir.IntType(32), [lanes]), "llvm.vector.reduce.add.v8i32")
    return builder.call(reduce_add, [builder.mul(builder.sub(dots, offsets), scales)])


def _block_dot_q6(nibble, form):
    """An intrinsic (q, qoff, tops, toff, sa, sb, x, xoff) -> int32 (see the docstring),
    computed by form (_q6_generic or _q6_vnni: the same exact integer)."""
    def typer(typingctx, q, qoff, tops, toff, sa, sb, x, xoff):
        if not (isinstance(q, types.Array) and q.layout == "C" and q.dtype == types.uint8
                and isinstance(tops, types.Array) and tops.layout == "C" and tops.dtype == types.uint8
                and isinstance(x, types.Array) and x.layout == "C" and x.dtype == types.int8):
            return None
        signature = types.int32(q, types.intp, tops, types.intp, types.int32, types.int32, x,
                                types.intp)

        def codegen(context, builder, sig, args):
            return form(context, builder, sig, args, nibble)
        return signature, codegen
    return intrinsic(typer)


def _low(builder, q):
    return builder.and_(q, _splat(15))


def _high(builder, q):
    return builder.lshr(q, _splat(4))


Q6_DOTS = {"generic": (_block_dot_q6(_low, _q6_generic), _block_dot_q6(_high, _q6_generic)),
           "vnni": (_block_dot_q6(_low, _q6_vnni), _block_dot_q6(_high, _q6_vnni))}
dot32_q6_low, dot32_q6_high = Q6_DOTS["vnni" if HAS_VNNI else "generic"]
