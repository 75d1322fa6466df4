"""LLVM IR for packed_gemm.py's inner loops: 16 rows of W (a group) in the 16 lanes of
a vector, 8 rows of x at a time, so no dot product ever needs a horizontal sum.

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

_I8, _I32, _I64, _F32 = ir.IntType(8), ir.IntType(32), ir.IntType(64), ir.FloatType()
_FLOATS = ir.VectorType(_F32, LANES)
_INTS = ir.VectorType(_I32, LANES)
_BYTES = ir.VectorType(_I8, LANES)
_QUAD_BYTES = ir.VectorType(_I8, 4 * LANES)


def _index(value: int) -> ir.Constant:
    return ir.Constant(_I64, value)


def _mask(values) -> ir.Constant:
    values = list(values)
    return ir.Constant(ir.VectorType(_I32, len(values)), values)


def _splat(builder, value, vector_type):
    one = builder.insert_element(ir.Constant(vector_type, None), value, ir.Constant(_I32, 0))
    return builder.shuffle_vector(one, ir.Constant(vector_type, None), _mask([0] * vector_type.count))


def _pointer(context, builder, array_type, array, offset, as_type=None):
    """The address of element `offset` (flat) of a C-contiguous array, optionally cast
    to a pointer to as_type."""
    address = builder.gep(context.make_array(array_type)(context, builder, array).data, [offset])
    return address if as_type is None else builder.bitcast(address, as_type.as_pointer())


def _c_array(array_type, dtypes) -> bool:
    return isinstance(array_type, types.Array) and array_type.layout == "C" and array_type.dtype in dtypes


# -- widening a group ----------------------------------------------------------------

def _transpose_16x16(builder, rows: list) -> list:
    """16 vectors of 16 bytes -> 16 vectors, vector p holding byte p of each input in
    order: four rounds of pairing vector i with i + 8 by byte interleaves."""
    low = _mask(i // 2 + (LANES if i % 2 else 0) for i in range(LANES))
    high = _mask(LANES // 2 + i // 2 + (LANES if i % 2 else 0) for i in range(LANES))
    for _ in range(4):
        paired = []
        for i in range(LANES // 2):
            a, b = rows[i], rows[i + LANES // 2]
            paired += [builder.shuffle_vector(a, b, low), builder.shuffle_vector(a, b, high)]
        rows = paired
    return rows


def _group_columns(context, builder, array_type, quants, n0, p0):
    """Bytes p0 .. p0 + 15 of rows n0 .. n0 + 15 of a 2-D byte array, as 16 vectors:
    vector p holds column p0 + p of the 16 rows. Returns them and the row length."""
    q = context.make_array(array_type)(context, builder, quants)
    row_bytes = builder.extract_value(q.shape, 1)
    rows = []
    for j in range(LANES):
        at = builder.add(builder.mul(builder.add(n0, _index(j)), row_bytes), p0)
        rows.append(builder.load(builder.bitcast(builder.gep(q.data, [at]), _BYTES.as_pointer()),
                                 align=1))
    return _transpose_16x16(builder, rows), row_bytes


def _row_tops(context, builder, array_type, tops, n0, column0):
    """Q6_K's bits 4 and 5 of columns column0 .. column0 + 15 (a multiple of 16) of rows
    n0 .. n0 + 15, row j as 16 bytes of their weight in q (16 and 32), column order.
    (Block b's two bit planes are bytes 8b .. 8b + 3 and 8b + 4 .. 8b + 7 of a row:
    model/packed.py; a half block is 2 bytes of each.)"""
    t = context.make_array(array_type)(context, builder, tops)
    row_bytes = builder.extract_value(t.shape, 1)
    within = builder.add(builder.mul(builder.lshr(column0, _index(5)), _index(8)),
                         builder.and_(builder.lshr(column0, _index(3)), _index(2)))
    rows = []
    for j in range(LANES):
        at = builder.add(builder.mul(builder.add(n0, _index(j)), row_bytes), within)
        row = ir.Constant(_BYTES, [0] * LANES)
        for plane in range(2):
            address = builder.gep(t.data, [builder.add(at, _index(4 * plane))])
            half = builder.load(builder.bitcast(address, ir.IntType(16).as_pointer()), align=1)
            bits = builder.zext(builder.bitcast(half, ir.VectorType(ir.IntType(1), LANES)), _BYTES)
            row = builder.or_(row, builder.shl(bits, ir.Constant(_BYTES, [4 + plane] * LANES)))
        rows.append(row)
    return rows


def _high_bits(context, builder, sig_highs, highs, sig_tops, tops, n0, column0):
    """Rows of the bits above the nibbles (_row_fifth_bits or _row_tops), or None."""
    if not isinstance(sig_highs, types.NoneType):
        return _row_fifth_bits(context, builder, sig_highs, highs, n0, column0)
    if not isinstance(sig_tops, types.NoneType):
        return _row_tops(context, builder, sig_tops, tops, n0, column0)
    return None


def _with_high_bits(context, builder, sigs, arrays, n0, p0, row_bytes, halves):
    """halves: [(low, high)] nibble columns p0 + p and K/2 + p0 + p, p < 16; with Q5_x's
    fifth bits or Q6_K's top bits (sigs, arrays: highs and tops, either given) added
    in: q = nibble + 16 * bits."""
    low_rows = _high_bits(context, builder, sigs[0], arrays[0], sigs[1], arrays[1], n0, p0)
    if low_rows is None:
        return halves
    high_rows = _high_bits(context, builder, sigs[0], arrays[0], sigs[1], arrays[1], n0,
                           builder.add(p0, row_bytes))
    low_bits, high_bits = _transpose_16x16(builder, low_rows), _transpose_16x16(builder, high_rows)
    return [(builder.or_(low, lb), builder.or_(high, hb))
            for (low, high), lb, hb in zip(halves, low_bits, high_bits)]


def _group_subscales(context, builder, array_type, scales, n0, column):
    """Q6_K's int8 scales of rows n0 .. n0 + 15 at the 16 columns from `column` (a
    multiple of 16), as int32 lanes."""
    a = context.make_array(array_type)(context, builder, scales)
    row_length = builder.extract_value(a.shape, 1)
    sub = builder.lshr(column, _index(4))
    lanes = ir.Constant(_INTS, None)
    for j in range(LANES):
        at = builder.add(builder.mul(builder.add(n0, _index(j)), row_length), sub)
        value = builder.sext(builder.load(builder.gep(a.data, [at])), _I32)
        lanes = builder.insert_element(lanes, value, ir.Constant(_I32, j))
    return lanes


def _nibbles(builder, column):
    """A column of Q4 bytes -> (low nibbles, high nibbles), as bytes."""
    return (builder.and_(column, ir.Constant(_BYTES, [15] * LANES)),
            builder.lshr(column, ir.Constant(_BYTES, [4] * LANES)))


def _highs_ok(highs) -> bool:
    return isinstance(highs, types.NoneType) or (highs.ndim == 2 and _c_array(highs, (types.uint8,)))


@intrinsic
def widen_chunk_float(typingctx, quants, highs, tops, subscales, n0, p0, offset, wt):
    """Bytes p0 .. p0 + 15 of the group's rows n0 .. n0 + 15 into wt (float32, k-major):
    Q8_0 (int8 quants): wt[(p0 + p) * 16 + j] = q; Q4_x, Q5_x, K-quants (uint8): column
    p0 + p from the low nibble and K/2 + p0 + p from the high one (plus 16 times the
    fifth bit from highs, for Q5_x and Q5_K), each minus offset (8: Q4_0, 16: Q5_0).
    Q6_K (tops and its int8 subscales given): q from the nibbles and tops, widened to
    sc * (q - 32)."""
    if not (quants.ndim == 2 and _c_array(quants, (types.int8, types.uint8))
            and _highs_ok(highs) and _highs_ok(tops) and _c_array(wt, (types.float32,))):
        return None
    signed = quants.dtype == types.int8
    q6_k = not isinstance(tops, types.NoneType)
    if q6_k and not (subscales.ndim == 2 and _c_array(subscales, (types.int8,))):
        return None

    def codegen(context, builder, sig, args):
        q_arr, h_arr, t_arr, s_arr, n0, p0, offset, wt_arr = args
        columns, row_bytes = _group_columns(context, builder, sig.args[0], q_arr, n0, p0)
        minus = _splat(builder, builder.trunc(offset, _I32), _INTS)

        def store(values, column):
            pointer = _pointer(context, builder, sig.args[7], wt_arr,
                               builder.mul(column, _index(LANES)), _FLOATS)
            builder.store(builder.sitofp(values, _FLOATS), pointer, align=4)
        if signed:
            for p, column in enumerate(columns):
                store(builder.sext(column, _INTS), builder.add(p0, _index(p)))
            return context.get_dummy_value()
        halves = _with_high_bits(context, builder, sig.args[1:3], (h_arr, t_arr), n0, p0,
                                 row_bytes, [_nibbles(builder, column) for column in columns])
        if q6_k:  # sc * (q - 32): one sub-scale a row for all 16 columns of a half
            thirty_two = ir.Constant(_INTS, [32] * LANES)
            low_sc = _group_subscales(context, builder, sig.args[3], s_arr, n0, p0)
            high_sc = _group_subscales(context, builder, sig.args[3], s_arr, n0,
                                       builder.add(p0, row_bytes))
        for p, (low, high) in enumerate(halves):
            at = builder.add(p0, _index(p))
            for nibble, column, sc in ((low, at, low_sc if q6_k else None),
                                       (high, builder.add(at, row_bytes), high_sc if q6_k else None)):
                if q6_k:
                    store(builder.mul(builder.sub(builder.zext(nibble, _INTS), thirty_two), sc), column)
                else:
                    store(builder.sub(builder.zext(nibble, _INTS), minus), column)
        return context.get_dummy_value()
    return types.void(quants, highs, tops, subscales, types.intp, types.intp, types.intp, wt), codegen


def _quads(builder, rows):
    """16 rows of 16 bytes (as 4 int32 each) -> 4 vectors of 64 bytes, vector c holding
    bytes 4c .. 4c + 3 of row j at 4j .. 4j + 3: the layout vpdpbusd reads. A transpose
    of 4-byte words, not of bytes: a few word shuffles."""
    def concat(a, b):
        return builder.shuffle_vector(a, b, _mask(range(2 * a.type.count)))
    fours = [concat(concat(rows[i], rows[i + 1]), concat(rows[i + 2], rows[i + 3]))
             for i in range(0, LANES, 4)]  # fours[a] lane 4r + c: row 4a + r, word c
    halves = [concat(fours[0], fours[1]), concat(fours[2], fours[3])]  # rows 0-7, 8-15
    out = []
    for c in range(4):
        low = builder.shuffle_vector(halves[0], halves[0], _mask(4 * j + c for j in range(8)))
        high = builder.shuffle_vector(halves[1], halves[1], _mask(4 * j + c for j in range(8)))
        out.append(builder.bitcast(concat(low, high), _QUAD_BYTES))
    return out


def _group_words(context, builder, array_type, array, n0, byte0):
    """Bytes byte0 .. byte0 + 15 of rows n0 .. n0 + 15 of a 2-D byte array, row j as 4
    int32 words (one 16-byte load). Returns them and the row length in bytes."""
    a = context.make_array(array_type)(context, builder, array)
    row_bytes = builder.extract_value(a.shape, 1)
    words = ir.VectorType(_I32, 4)
    rows = []
    for j in range(LANES):
        at = builder.add(builder.mul(builder.add(n0, _index(j)), row_bytes), byte0)
        rows.append(builder.load(builder.bitcast(builder.gep(a.data, [at]), words.as_pointer()),
                                 align=1))
    return rows, row_bytes


def _row_fifth_bits(context, builder, array_type, highs, n0, column0):
    """Q5_x's fifth bits of columns column0 .. column0 + 15 (a multiple of 16) of rows
    n0 .. n0 + 15, row j as 16 bytes of 0 or 16 (the bit's weight in q), column order."""
    h = context.make_array(array_type)(context, builder, highs)
    row_bytes = builder.extract_value(h.shape, 1)
    rows = []
    for j in range(LANES):
        at = builder.add(builder.mul(builder.add(n0, _index(j)), row_bytes),
                         builder.lshr(column0, _index(3)))
        word = builder.load(builder.bitcast(builder.gep(h.data, [at]), ir.IntType(16).as_pointer()),
                            align=1)
        bits = builder.zext(builder.bitcast(word, ir.VectorType(ir.IntType(1), LANES)), _BYTES)
        rows.append(builder.shl(bits, ir.Constant(_BYTES, [4] * LANES)))
    return rows


@intrinsic
def widen_chunk_bytes(typingctx, quants, highs, tops, n0, p0, wb):
    """Bytes p0 .. p0 + 15 of the group's rows into wb (uint8, the vnni layout):
    Q8_0 (int8): q + 128 (so unsigned); Q4_x, Q5_x, K-quants (uint8): q, the low
    nibbles' as columns p0 + p, the high ones' as K/2 + p0 + p (with the fifth bits
    from highs or Q6_K's top bits from tops; offsets and sub-scales are applied to
    the dots)."""
    if not (quants.ndim == 2 and _c_array(quants, (types.int8, types.uint8))
            and _highs_ok(highs) and _highs_ok(tops) and _c_array(wb, (types.uint8,))):
        return None
    signed = quants.dtype == types.int8

    def codegen(context, builder, sig, args):
        q_arr, h_arr, t_arr, n0, p0, wb_arr = args
        rows, row_bytes = _group_words(context, builder, sig.args[0], q_arr, n0, p0)
        quads = _quads(builder, rows)  # quads[c]: bytes p0 + 4c .. + 3 of the 16 rows

        def store(chunk, first_column):  # 4 columns from first_column (a multiple of 4)
            at = builder.mul(first_column, _index(LANES))  # (4 columns x 16 rows = 64 bytes)
            builder.store(chunk, _pointer(context, builder, sig.args[5], wb_arr, at, _QUAD_BYTES),
                          align=1)

        def splat(value):
            return ir.Constant(_QUAD_BYTES, [value] * 4 * LANES)
        if signed:
            for c, quad in enumerate(quads):
                store(builder.xor(quad, splat(128)), builder.add(p0, _index(4 * c)))
            return context.get_dummy_value()
        low = [builder.and_(quad, splat(15)) for quad in quads]
        high = [builder.lshr(quad, splat(4)) for quad in quads]
        for half, column0 in ((low, p0), (high, builder.add(p0, row_bytes))):  # + 16 * bits
            rows = _high_bits(context, builder, sig.args[1], h_arr, sig.args[2], t_arr, n0, column0)
            if rows is not None:
                bits = _quads(builder, [builder.bitcast(r, ir.VectorType(_I32, 4)) for r in rows])
                half[:] = [builder.or_(v, b) for v, b in zip(half, bits)]
        for c in range(4):
            at = builder.add(p0, _index(4 * c))
            store(low[c], at)
            store(high[c], builder.add(at, row_bytes))
        return context.get_dummy_value()
    return types.void(quants, highs, tops, types.intp, types.intp, wb), codegen


# -- one block's products for 8 rows of x --------------------------------------------

def _accumulate(context, builder, sig, args, dots):
    """acc[i, :] = acc[i, :] + block_term(scale[b, :], low[b, :], dx[m0 + i, b], dots[i],
    qsum[m0 + i, b]) for i < 8, lane by lane (args as in the intrinsics below)."""
    t_scale, t_low, t_dx, t_qsum, t_acc = (sig.args[i] for i in (4, 5, 7, 8, 10))
    _, _, _, _, scale_arr, low_arr, b, dx_arr, qsum_arr, m0, acc_arr = args[:11]
    with_min = not isinstance(t_low, types.NoneType)
    n_blocks = builder.extract_value(context.make_array(t_dx)(context, builder, dx_arr).shape, 1)
    row_at = builder.mul(b, _index(LANES))
    scale = builder.load(_pointer(context, builder, t_scale, scale_arr, row_at, _FLOATS), align=4)
    if with_min:
        low = builder.load(_pointer(context, builder, t_low, low_arr, row_at, _FLOATS), align=4)
    for i in range(X_ROWS):
        at = builder.add(builder.mul(builder.add(m0, _index(i)), n_blocks), b)
        x_scale = _splat(builder, builder.load(_pointer(context, builder, t_dx, dx_arr, at)), _FLOATS)
        term = builder.fmul(builder.fmul(scale, x_scale), dots[i])
        if with_min:
            total = builder.sitofp(builder.load(_pointer(context, builder, t_qsum, qsum_arr, at)), _F32)
            term = builder.fadd(term, builder.fmul(builder.fmul(low, x_scale),
                                                   _splat(builder, total, _FLOATS)))
        pointer = _pointer(context, builder, t_acc, acc_arr, _index(i * LANES), _FLOATS)
        builder.store(builder.fadd(builder.load(pointer, align=4), term), pointer, align=4)


def _block_types_ok(w, wdtype, x, xdtype, scale, low, dx, qsum, acc) -> bool:
    floats = (scale, dx, acc) + (() if isinstance(low, types.NoneType) else (low,))
    return (_c_array(w, (wdtype,)) and _c_array(x, (xdtype,)) and _c_array(qsum, (types.int32,))
            and all(_c_array(a, (types.float32,)) for a in floats))


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
        fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_FLOATS, [_FLOATS] * 3),
                                             "llvm.fma.v16f32")
        x = context.make_array(sig.args[2])(context, builder, xf_arr)
        width = builder.extract_value(x.shape, 1)
        dots = [ir.Constant(_FLOATS, [0.0] * LANES) for _ in range(X_ROWS)]
        for k in range(BLOCK):
            w = builder.load(_pointer(context, builder, sig.args[0], wt_arr,
                                      builder.add(w_at, _index(k * LANES)), _FLOATS), align=4)
            for i in range(X_ROWS):
                at = builder.add(builder.add(builder.mul(builder.add(m0, _index(i)), width), x_at),
                                 _index(k))
                value = builder.load(_pointer(context, builder, sig.args[2], xf_arr, at))
                dots[i] = builder.call(fma, [w, _splat(builder, value, _FLOATS), dots[i]])
        _accumulate(context, builder, sig, args, dots)
        return context.get_dummy_value()
    return signature, codegen


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
        wb_arr, w_at, xq_arr, x_at = args[:4]
        dx_arr, qsum_arr, m0, offset = args[7], args[8], args[9], args[11]
        dpbusd = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_INTS, [_INTS] * 3),
                                                "llvm.x86.avx512.vpdpbusd.512")
        x = context.make_array(sig.args[2])(context, builder, xq_arr)
        width = builder.extract_value(x.shape, 1)
        n_blocks = builder.extract_value(context.make_array(sig.args[7])(context, builder, dx_arr).shape, 1)
        sums = [ir.Constant(_INTS, [0] * LANES) for _ in range(X_ROWS)]
        for c in range(BLOCK // 4):
            w = builder.load(_pointer(context, builder, sig.args[0], wb_arr,
                                      builder.add(w_at, _index(c * 4 * LANES)), _INTS), align=1)
            for i in range(X_ROWS):
                at = builder.add(builder.add(builder.mul(builder.add(m0, _index(i)), width), x_at),
                                 _index(4 * c))
                quad = builder.load(_pointer(context, builder, sig.args[2], xq_arr, at, _I32), align=1)
                sums[i] = builder.call(dpbusd, [sums[i], w, _splat(builder, quad, _INTS)])
        shift = builder.trunc(offset, _I32)
        dots = []
        for i in range(X_ROWS):
            at = builder.add(builder.mul(builder.add(m0, _index(i)), n_blocks), args[6])
            total = builder.load(_pointer(context, builder, sig.args[8], qsum_arr, at))
            exact = builder.sub(sums[i], _splat(builder, builder.mul(shift, total), _INTS))
            dots.append(builder.sitofp(exact, _FLOATS))
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
            and isinstance(low, types.NoneType) and _c_array(subs, (types.int32,))):
        return None
    signature = types.void(wb, types.intp, xq, types.intp, scale, low, types.intp, dx, halves,
                           types.intp, acc, subs)

    def codegen(context, builder, sig, args):
        wb_arr, w_at, xq_arr, x_at = args[:4]
        b, halves_arr, m0, subs_arr = args[6], args[8], args[9], args[11]
        dpbusd = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_INTS, [_INTS] * 3),
                                                "llvm.x86.avx512.vpdpbusd.512")
        x = context.make_array(sig.args[2])(context, builder, xq_arr)
        width = builder.extract_value(x.shape, 1)
        n_halves = builder.extract_value(
            context.make_array(sig.args[8])(context, builder, halves_arr).shape, 1)
        zero = ir.Constant(_INTS, [0] * LANES)
        sums = [[zero, zero] for _ in range(X_ROWS)]  # [row of x][half]
        for c in range(BLOCK // 4):
            w = builder.load(_pointer(context, builder, sig.args[0], wb_arr,
                                      builder.add(w_at, _index(c * 4 * LANES)), _INTS), align=1)
            for i in range(X_ROWS):
                at = builder.add(builder.add(builder.mul(builder.add(m0, _index(i)), width), x_at),
                                 _index(4 * c))
                quad = builder.load(_pointer(context, builder, sig.args[2], xq_arr, at, _I32), align=1)
                sums[i][c // 4] = builder.call(dpbusd, [sums[i][c // 4], w, _splat(builder, quad, _INTS)])
        sub_scales = [builder.load(_pointer(context, builder, sig.args[11], subs_arr,
                                            builder.mul(builder.add(builder.mul(b, _index(2)), _index(h)),
                                                        _index(LANES)), _INTS), align=4)
                      for h in range(2)]
        dots = []
        for i in range(X_ROWS):
            exact = zero
            for h in range(2):
                at = builder.add(builder.mul(builder.add(m0, _index(i)), n_halves),
                                 builder.add(builder.mul(b, _index(2)), _index(h)))
                total = builder.load(_pointer(context, builder, sig.args[8], halves_arr, at))
                centred = builder.sub(sums[i][h], _splat(builder, builder.mul(total, ir.Constant(_I32, 32)),
                                                         _INTS))
                exact = builder.add(exact, builder.mul(centred, sub_scales[h]))
            dots.append(builder.sitofp(exact, _FLOATS))
        _accumulate(context, builder, sig, args, dots)
        return context.get_dummy_value()
    return signature, codegen
