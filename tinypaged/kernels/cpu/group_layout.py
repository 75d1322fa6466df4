"""Laying out a group of 16 W rows for packed_gemm.py's inner loops (group_ir.py): the
float form's float32 columns (k-major) and the vnni form's bytes, 4 columns a lane,
read from every packed kind's arrays (formats/packed.py): Q8_0's int8 quants, the Q4
and Q5 nibbles with their fifth bits, the K-quants' nibbles with Q5_K's fifth bits or
Q6_K's two bit planes and sub-scales. Loads of 16 rows' bytes become columns by
byte or word transposes, never by scalar loops.
"""
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from .group_ir import (BYTES, FLOATS, I32, INTS, LANES, QUAD_BYTES, c_array, index, mask,
                       pointer, splat)

def _transpose_16x16(builder, rows: list) -> list:
    """16 vectors of 16 bytes -> 16 vectors, vector p holding byte p of each input in
    order: four rounds of pairing vector i with i + 8 by byte interleaves."""
    low = mask(i // 2 + (LANES if i % 2 else 0) for i in range(LANES))
    high = mask(LANES // 2 + i // 2 + (LANES if i % 2 else 0) for i in range(LANES))
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
        at = builder.add(builder.mul(builder.add(n0, index(j)), row_bytes), p0)
        rows.append(builder.load(builder.bitcast(builder.gep(q.data, [at]), BYTES.as_pointer()),
                                 align=1))
    return _transpose_16x16(builder, rows), row_bytes


def _row_tops(context, builder, array_type, tops, n0, column0):
    """Q6_K's bits 4 and 5 of columns column0 .. column0 + 15 (a multiple of 16) of rows
    n0 .. n0 + 15, row j as 16 bytes of their weight in q (16 and 32), column order.
    (Block b's two bit planes are bytes 8b .. 8b + 3 and 8b + 4 .. 8b + 7 of a row:
    formats/packed.py; a half block is 2 bytes of each.)"""
    t = context.make_array(array_type)(context, builder, tops)
    row_bytes = builder.extract_value(t.shape, 1)
    within = builder.add(builder.mul(builder.lshr(column0, index(5)), index(8)),
                         builder.and_(builder.lshr(column0, index(3)), index(2)))
    rows = []
    for j in range(LANES):
        at = builder.add(builder.mul(builder.add(n0, index(j)), row_bytes), within)
        row = ir.Constant(BYTES, [0] * LANES)
        for plane in range(2):
            address = builder.gep(t.data, [builder.add(at, index(4 * plane))])
            half = builder.load(builder.bitcast(address, ir.IntType(16).as_pointer()), align=1)
            bits = builder.zext(builder.bitcast(half, ir.VectorType(ir.IntType(1), LANES)), BYTES)
            row = builder.or_(row, builder.shl(bits, ir.Constant(BYTES, [4 + plane] * LANES)))
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
    sub = builder.lshr(column, index(4))
    lanes = ir.Constant(INTS, None)
    for j in range(LANES):
        at = builder.add(builder.mul(builder.add(n0, index(j)), row_length), sub)
        value = builder.sext(builder.load(builder.gep(a.data, [at])), I32)
        lanes = builder.insert_element(lanes, value, ir.Constant(I32, j))
    return lanes


def _nibbles(builder, column):
    """A column of Q4 bytes -> (low nibbles, high nibbles), as bytes."""
    return (builder.and_(column, ir.Constant(BYTES, [15] * LANES)),
            builder.lshr(column, ir.Constant(BYTES, [4] * LANES)))


def _highs_ok(highs) -> bool:
    return isinstance(highs, types.NoneType) or (highs.ndim == 2 and c_array(highs, (types.uint8,)))


@intrinsic
def widen_chunk_float(typingctx, quants, highs, tops, subscales, n0, p0, offset, wt):
    """Bytes p0 .. p0 + 15 of the group's rows n0 .. n0 + 15 into wt (float32, k-major):
    Q8_0 (int8 quants): wt[(p0 + p) * 16 + j] = q; Q4_x, Q5_x, K-quants (uint8): column
    p0 + p from the low nibble and K/2 + p0 + p from the high one (plus 16 times the
    fifth bit from highs, for Q5_x and Q5_K), each minus offset (8: Q4_0, 16: Q5_0).
    Q6_K (tops and its int8 subscales given): q from the nibbles and tops, widened to
    sc * (q - 32)."""
    if not (quants.ndim == 2 and c_array(quants, (types.int8, types.uint8))
            and _highs_ok(highs) and _highs_ok(tops) and c_array(wt, (types.float32,))):
        return None
    signed = quants.dtype == types.int8
    q6_k = not isinstance(tops, types.NoneType)
    if q6_k and not (subscales.ndim == 2 and c_array(subscales, (types.int8,))):
        return None

    def codegen(context, builder, sig, args):
        q_arr, h_arr, t_arr, s_arr, n0, p0, offset, wt_arr = args
        columns, row_bytes = _group_columns(context, builder, sig.args[0], q_arr, n0, p0)
        minus = splat(builder, builder.trunc(offset, I32), INTS)

        def store(values, column):
            at_wt = pointer(context, builder, sig.args[7], wt_arr, builder.mul(column, index(LANES)),
                            FLOATS)
            builder.store(builder.sitofp(values, FLOATS), at_wt, align=4)
        if signed:
            for p, column in enumerate(columns):
                store(builder.sext(column, INTS), builder.add(p0, index(p)))
            return context.get_dummy_value()
        halves = _with_high_bits(context, builder, sig.args[1:3], (h_arr, t_arr), n0, p0,
                                 row_bytes, [_nibbles(builder, column) for column in columns])
        if q6_k:  # sc * (q - 32): one sub-scale a row for all 16 columns of a half
            thirty_two = ir.Constant(INTS, [32] * LANES)
            low_sc = _group_subscales(context, builder, sig.args[3], s_arr, n0, p0)
            high_sc = _group_subscales(context, builder, sig.args[3], s_arr, n0,
                                       builder.add(p0, row_bytes))
        for p, (low, high) in enumerate(halves):
            at = builder.add(p0, index(p))
            for nibble, column, sc in ((low, at, low_sc if q6_k else None),
                                       (high, builder.add(at, row_bytes), high_sc if q6_k else None)):
                if q6_k:
                    store(builder.mul(builder.sub(builder.zext(nibble, INTS), thirty_two), sc), column)
                else:
                    store(builder.sub(builder.zext(nibble, INTS), minus), column)
        return context.get_dummy_value()
    return types.void(quants, highs, tops, subscales, types.intp, types.intp, types.intp, wt), codegen


def _quads(builder, rows):
    """16 rows of 16 bytes (as 4 int32 each) -> 4 vectors of 64 bytes, vector c holding
    bytes 4c .. 4c + 3 of row j at 4j .. 4j + 3: the layout vpdpbusd reads. A transpose
    of 4-byte words, not of bytes: a few word shuffles."""
    def concat(a, b):
        return builder.shuffle_vector(a, b, mask(range(2 * a.type.count)))
    fours = [concat(concat(rows[i], rows[i + 1]), concat(rows[i + 2], rows[i + 3]))
             for i in range(0, LANES, 4)]  # fours[a] lane 4r + c: row 4a + r, word c
    halves = [concat(fours[0], fours[1]), concat(fours[2], fours[3])]  # rows 0-7, 8-15
    out = []
    for c in range(4):
        low = builder.shuffle_vector(halves[0], halves[0], mask(4 * j + c for j in range(8)))
        high = builder.shuffle_vector(halves[1], halves[1], mask(4 * j + c for j in range(8)))
        out.append(builder.bitcast(concat(low, high), QUAD_BYTES))
    return out


def _group_words(context, builder, array_type, array, n0, byte0):
    """Bytes byte0 .. byte0 + 15 of rows n0 .. n0 + 15 of a 2-D byte array, row j as 4
    int32 words (one 16-byte load). Returns them and the row length in bytes."""
    a = context.make_array(array_type)(context, builder, array)
    row_bytes = builder.extract_value(a.shape, 1)
    words = ir.VectorType(I32, 4)
    rows = []
    for j in range(LANES):
        at = builder.add(builder.mul(builder.add(n0, index(j)), row_bytes), byte0)
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
        at = builder.add(builder.mul(builder.add(n0, index(j)), row_bytes),
                         builder.lshr(column0, index(3)))
        word = builder.load(builder.bitcast(builder.gep(h.data, [at]), ir.IntType(16).as_pointer()),
                            align=1)
        bits = builder.zext(builder.bitcast(word, ir.VectorType(ir.IntType(1), LANES)), BYTES)
        rows.append(builder.shl(bits, ir.Constant(BYTES, [4] * LANES)))
    return rows


@intrinsic
def widen_chunk_bytes(typingctx, quants, highs, tops, n0, p0, wb):
    """Bytes p0 .. p0 + 15 of the group's rows into wb (uint8, the vnni layout):
    Q8_0 (int8): q + 128 (so unsigned); Q4_x, Q5_x, K-quants (uint8): q, the low
    nibbles' as columns p0 + p, the high ones' as K/2 + p0 + p (with the fifth bits
    from highs or Q6_K's top bits from tops; offsets and sub-scales are applied to
    the dots)."""
    if not (quants.ndim == 2 and c_array(quants, (types.int8, types.uint8))
            and _highs_ok(highs) and _highs_ok(tops) and c_array(wb, (types.uint8,))):
        return None
    signed = quants.dtype == types.int8

    def codegen(context, builder, sig, args):
        q_arr, h_arr, t_arr, n0, p0, wb_arr = args
        rows, row_bytes = _group_words(context, builder, sig.args[0], q_arr, n0, p0)
        quads = _quads(builder, rows)  # quads[c]: bytes p0 + 4c .. + 3 of the 16 rows

        def store(chunk, first_column):  # 4 columns from first_column (a multiple of 4)
            at = builder.mul(first_column, index(LANES))  # (4 columns x 16 rows = 64 bytes)
            builder.store(chunk, pointer(context, builder, sig.args[5], wb_arr, at, QUAD_BYTES),
                          align=1)

        def every_byte(value):
            return ir.Constant(QUAD_BYTES, [value] * 4 * LANES)
        if signed:
            for c, quad in enumerate(quads):
                store(builder.xor(quad, every_byte(128)), builder.add(p0, index(4 * c)))
            return context.get_dummy_value()
        low = [builder.and_(quad, every_byte(15)) for quad in quads]
        high = [builder.lshr(quad, every_byte(4)) for quad in quads]
        for half, column0 in ((low, p0), (high, builder.add(p0, row_bytes))):  # + 16 * bits
            rows = _high_bits(context, builder, sig.args[1], h_arr, sig.args[2], t_arr, n0, column0)
            if rows is not None:
                bits = _quads(builder, [builder.bitcast(r, ir.VectorType(I32, 4)) for r in rows])
                half[:] = [builder.or_(v, b) for v, b in zip(half, bits)]
        for c in range(4):
            at = builder.add(p0, index(4 * c))
            store(low[c], at)
            store(high[c], builder.add(at, row_bytes))
        return context.get_dummy_value()
    return types.void(quants, highs, tops, types.intp, types.intp, wb), codegen
