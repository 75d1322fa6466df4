"""LLVM IR for packed_gemm.py's inner loops: 16 rows of W (a group) in the 16 lanes of
a vector, 8 rows of x at a time, so no dot product ever needs a horizontal sum.
This file holds the shared IR helpers and one block's products; group_layout.py
lays a group out in the two forms below.

Two ways to the exact integer dot products of one 32-column block:
  float   the group widened to float32, k-major (wt[k * 16 + j]); 32 steps of one
          load and 8 fused multiply-adds with x[m, k] broadcast. Exact: products and
          sums of small integers. Any CPU (LLVM lowers the 16-lane vectors).
  vnni    the group kept as unsigned bytes, 4 columns per lane (wb[c * 64 + j * 4 + t]
          is row j, column 4c + t); 8 steps of one load and 8 vpdpbusd with x's 4
          bytes broadcast. 4x the multiply-adds per instruction; CPUs with AVX-512
          VNNI only (packed_gemm.py picks).
Both then scale the dots with block_term's float32 operations, in its order
(packed_terms.py), so both give the GEMV's bits.

Q6_K's block dot is sa * (its first 16 columns') + sb * (its last 16's), with int8
sub-scales sa, sb and weights q - 32. The float form widens each weight to
sc * (q - 32) (below 2^12; the block's sum stays below 2^24, exact). The vnni form
keeps q (0 .. 63) in bytes, sums the halves apart and applies the 32 and the
sub-scales to the two int32 sums.
"""
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

LANES = 16  # W rows per group: one 512-bit vector of float32 / int32
X_ROWS = 8  # rows of x per call: eight accumulators
BLOCK = 32  # columns per scale

I8, I32, I64, F32 = ir.IntType(8), ir.IntType(32), ir.IntType(64), ir.FloatType()
FLOATS = ir.VectorType(F32, LANES)
INTS = ir.VectorType(I32, LANES)
BYTES = ir.VectorType(I8, LANES)
QUAD_BYTES = ir.VectorType(I8, 4 * LANES)


def index(value: int) -> ir.Constant:
    return ir.Constant(I64, value)


def mask(values) -> ir.Constant:
    values = list(values)
    return ir.Constant(ir.VectorType(I32, len(values)), values)


def splat(builder, value, vector_type):
    one = builder.insert_element(ir.Constant(vector_type, None), value, ir.Constant(I32, 0))
    return builder.shuffle_vector(one, ir.Constant(vector_type, None), mask([0] * vector_type.count))


def pointer(context, builder, array_type, array, offset, as_type=None):
    """The address of element `offset` (flat) of a C-contiguous array, optionally cast
    to a pointer to as_type."""
    address = builder.gep(context.make_array(array_type)(context, builder, array).data, [offset])
    return address if as_type is None else builder.bitcast(address, as_type.as_pointer())


def c_array(array_type, dtypes) -> bool:
    return isinstance(array_type, types.Array) and array_type.layout == "C" and array_type.dtype in dtypes


def fused(builder):
    """llvm.fma on 16 float32 lanes: a * b + c, rounded once (common.fma32's bits)."""
    return cgutils.get_or_insert_function(builder.module, ir.FunctionType(FLOATS, [FLOATS] * 3),
                                          "llvm.fma.v16f32")


def _accumulate(context, builder, sig, args, dots):
    """acc[i, :] = fma(dx[m0 + i, b], block_term(scale[b, :], low[b, :], dots[i],
    qsum[m0 + i, b]), acc[i, :]) for i < 8, lane by lane (args as in the intrinsics
    below; packed_terms.py)."""
    t_scale, t_low, t_dx, t_qsum, t_acc = (sig.args[i] for i in (4, 5, 7, 8, 10))
    _, _, _, _, scale_arr, low_arr, b, dx_arr, qsum_arr, m0, acc_arr = args[:11]
    with_min = not isinstance(t_low, types.NoneType)
    fma = fused(builder)
    n_blocks = builder.extract_value(context.make_array(t_dx)(context, builder, dx_arr).shape, 1)
    row_at = builder.mul(b, index(LANES))
    scale = builder.load(pointer(context, builder, t_scale, scale_arr, row_at, FLOATS), align=4)
    if with_min:
        low = builder.load(pointer(context, builder, t_low, low_arr, row_at, FLOATS), align=4)
    for i in range(X_ROWS):
        at = builder.add(builder.mul(builder.add(m0, index(i)), n_blocks), b)
        x_scale = splat(builder, builder.load(pointer(context, builder, t_dx, dx_arr, at)), FLOATS)
        term = builder.fmul(scale, dots[i])
        if with_min:
            total = builder.sitofp(builder.load(pointer(context, builder, t_qsum, qsum_arr, at)), F32)
            term = builder.call(fma, [low, splat(builder, total, FLOATS), term])
        at_acc = pointer(context, builder, t_acc, acc_arr, index(i * LANES), FLOATS)
        builder.store(builder.call(fma, [x_scale, term, builder.load(at_acc, align=4)]), at_acc, align=4)


def _block_types_ok(w, wdtype, x, xdtype, scale, low, dx, qsum, acc) -> bool:
    floats = (scale, dx, acc) + (() if isinstance(low, types.NoneType) else (low,))
    return (c_array(w, (wdtype,)) and c_array(x, (xdtype,)) and c_array(qsum, (types.int32,))
            and all(c_array(a, (types.float32,)) for a in floats))


@intrinsic
def accumulate_block_float(typingctx, wt, w_at, xf, x_at, scale, low, b, dx, qsum, m0, acc):
    """For rows m0 + i (i < 8) of x and the group's rows j (< 16), block b (columns from
    x_at, wt from w_at): dot = sum over k < 32 of wt[w_at + 16 k + j] * xf[m0 + i, x_at + k]
    (float32 of integers: exact), then _accumulate. low: the group's mins, or None."""
    if not _block_types_ok(wt, types.float32, xf, types.float32, scale, low, dx, qsum, acc):
        return None
    signature = types.void(wt, types.intp, xf, types.intp, scale, low, types.intp, dx, qsum,
                           types.intp, acc)

    def codegen(context, builder, sig, args):
        wt_arr, w_at, xf_arr, x_at = args[:4]
        m0 = args[9]
        fma = fused(builder)
        x = context.make_array(sig.args[2])(context, builder, xf_arr)
        width = builder.extract_value(x.shape, 1)
        dots = [ir.Constant(FLOATS, [0.0] * LANES) for _ in range(X_ROWS)]
        for k in range(BLOCK):
            w = builder.load(pointer(context, builder, sig.args[0], wt_arr,
                                      builder.add(w_at, index(k * LANES)), FLOATS), align=4)
            for i in range(X_ROWS):
                at = builder.add(builder.add(builder.mul(builder.add(m0, index(i)), width), x_at),
                                 index(k))
                value = builder.load(pointer(context, builder, sig.args[2], xf_arr, at))
                dots[i] = builder.call(fma, [w, splat(builder, value, FLOATS), dots[i]])
        _accumulate(context, builder, sig, args, dots)
        return context.get_dummy_value()
    return signature, codegen


def _dpbusd_sums(context, builder, sig, args, parts: int) -> list:
    """[row i of x][part]: int32 lanes of sum over the block's columns of weight byte
    (wb from w_at) times x's int8 (xq from x_at, rows m0 + i), one vpdpbusd per 4
    columns; the block's 32 columns in `parts` equal runs summed apart."""
    wb_arr, w_at, xq_arr, x_at = args[:4]
    m0 = args[9]
    dpbusd = cgutils.get_or_insert_function(builder.module, ir.FunctionType(INTS, [INTS] * 3),
                                            "llvm.x86.avx512.vpdpbusd.512")
    width = builder.extract_value(context.make_array(sig.args[2])(context, builder, xq_arr).shape, 1)
    steps = BLOCK // 4
    sums = [[ir.Constant(INTS, [0] * LANES)] * parts for _ in range(X_ROWS)]
    for c in range(steps):
        w = builder.load(pointer(context, builder, sig.args[0], wb_arr,
                                 builder.add(w_at, index(c * 4 * LANES)), INTS), align=1)
        part = c * parts // steps
        for i in range(X_ROWS):
            at = builder.add(builder.add(builder.mul(builder.add(m0, index(i)), width), x_at),
                             index(4 * c))
            quad = builder.load(pointer(context, builder, sig.args[2], xq_arr, at, I32), align=1)
            sums[i][part] = builder.call(dpbusd, [sums[i][part], w, splat(builder, quad, INTS)])
    return sums


@intrinsic
def accumulate_block_vnni(typingctx, wb, w_at, xq, x_at, scale, low, b, dx, qsum, m0, acc, offset):
    """accumulate_block_float's result from the byte layout: per 4 columns, one vpdpbusd
    per row of x (unsigned weight bytes times x's int8 values, 4 per lane), then the
    integer offset (128 for Q8_0's biased bytes, 8 for Q4_0, 16 for Q5_0, else 0) times the
    block's sum of x, all exact, then _accumulate."""
    if not _block_types_ok(wb, types.uint8, xq, types.int8, scale, low, dx, qsum, acc):
        return None
    signature = types.void(wb, types.intp, xq, types.intp, scale, low, types.intp, dx, qsum,
                           types.intp, acc, types.intp)

    def codegen(context, builder, sig, args):
        dx_arr, qsum_arr, m0, offset = args[7], args[8], args[9], args[11]
        n_blocks = builder.extract_value(context.make_array(sig.args[7])(context, builder, dx_arr).shape, 1)
        sums = _dpbusd_sums(context, builder, sig, args, 1)
        shift = builder.trunc(offset, I32)
        dots = []
        for i in range(X_ROWS):
            at = builder.add(builder.mul(builder.add(m0, index(i)), n_blocks), args[6])
            total = builder.load(pointer(context, builder, sig.args[8], qsum_arr, at))
            exact = builder.sub(sums[i][0], splat(builder, builder.mul(shift, total), INTS))
            dots.append(builder.sitofp(exact, FLOATS))
        _accumulate(context, builder, sig, args, dots)
        return context.get_dummy_value()
    return signature, codegen


@intrinsic
def accumulate_block_vnni_q6(typingctx, wb, w_at, xq, x_at, scale, low, b, dx, halves, m0, acc,
                             subs):
    """accumulate_block_vnni for Q6_K (low None; wb holds q, 0 .. 63): the block's two
    halves summed apart, dot = sa * (sum_a - 32 * xa) + sb * (sum_b - 32 * xb), with
    the group's sub-scales subs[2b], subs[2b + 1] (int32 lanes) and x's half-block
    sums xa, xb from halves (M8, K/16), all exact, then _accumulate."""
    if not (_block_types_ok(wb, types.uint8, xq, types.int8, scale, low, dx, halves, acc)
            and isinstance(low, types.NoneType) and c_array(subs, (types.int32,))):
        return None
    signature = types.void(wb, types.intp, xq, types.intp, scale, low, types.intp, dx, halves,
                           types.intp, acc, subs)

    def codegen(context, builder, sig, args):
        b, halves_arr, m0, subs_arr = args[6], args[8], args[9], args[11]
        n_halves = builder.extract_value(
            context.make_array(sig.args[8])(context, builder, halves_arr).shape, 1)
        zero = ir.Constant(INTS, [0] * LANES)
        sums = _dpbusd_sums(context, builder, sig, args, 2)  # [row of x][half]
        sub_scales = [builder.load(pointer(context, builder, sig.args[11], subs_arr,
                                            builder.mul(builder.add(builder.mul(b, index(2)), index(h)),
                                                        index(LANES)), INTS), align=4)
                      for h in range(2)]
        dots = []
        for i in range(X_ROWS):
            exact = zero
            for h in range(2):
                at = builder.add(builder.mul(builder.add(m0, index(i)), n_halves),
                                 builder.add(builder.mul(b, index(2)), index(h)))
                total = builder.load(pointer(context, builder, sig.args[8], halves_arr, at))
                centred = builder.sub(sums[i][h], splat(builder, builder.mul(total, ir.Constant(I32, 32)),
                                                         INTS))
                exact = builder.add(exact, builder.mul(centred, sub_scales[h]))
            dots.append(builder.sitofp(exact, FLOATS))
        _accumulate(context, builder, sig, args, dots)
        return context.get_dummy_value()
    return signature, codegen
