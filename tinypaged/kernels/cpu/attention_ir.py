"""LLVM IR for the products of attention items (attention_items.py): scores = K q for a
tile's rows, and acc += weights V. Written as small register-blocked matrix products,
because numba's loops keep their running sums in memory: each FMA then also loads and
stores a sum, and the item ran at ~7 multiply-adds a cycle.

    key_scores    a few rows' (a decode token's group) scores against one block's 16
                  keys, read from the pool as it holds K (transposed: D x 16 a block
                  and head, cache_ops.py): per d, one load of 16 keys' values (float16
                  widened in the register) and a broadcast of each row's q give one FMA
                  a row into 16 sums held in a register. No sum across lanes.
    weigh_keys    those rows' acc (rows, D) += weights . V over a block's keys, V read
                  from the pool's rows (float16 widened in the register): per key, a load
                  of its row's vectors and a broadcast of each row's weight, the rows'
                  sums held in registers across the keys.

    score_tile    scores (KEYS, Rp) = kbuf (KEYS, D) . q_t (D, Rp): 16 rows in the lanes
                  of a vector, 8 keys a pass: per d, one load of q_t and 8 broadcasts of
                  K give 8 FMAs into 8 sums held in registers.
    weigh_values  acc (Rp, D) += scores (KEYS, Rp)^T . vbuf (KEYS, D): 16 columns of D in
                  the lanes, 4 rows x 4 vectors of D a pass: per key, 4 loads of V and 4
                  broadcasts of the weights give 16 FMAs into sums held in registers.
(Halved with AVX2 only: KEYS_A_PASS, VECTORS_A_PASS.)

Rp: the tile's rows padded to a multiple of 16 (the caller zeroes q_t's and the
weights' padding). D a multiple of 16 (the caller checks; else its own loops).
"""
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from ..kv_q8 import KV_BLOCK
from .common import HAS_AVX512
from .vector_ir import FLOATS, LANES, c_array, index, pointer, splat

# The sums held in registers: 32 zmm with AVX-512; AVX2's 16 ymm hold half as many
# floats, and the AVX-512 shapes spilled a sum's load and store beside each FMA there
KEYS_A_PASS = 8 if HAS_AVX512 else 4  # score_tile's sums: 8 (4) keys x 16 rows
ROWS_A_PASS = 4  # weigh_values' sums: 4 rows x 4 (AVX2: 1) vectors of D
VECTORS_A_PASS = 4 if HAS_AVX512 else 1


def _float_matrix(t) -> bool:
    return c_array(t, (types.float32,)) and t.ndim == 2


def _shape(context, builder, array_type, array, axis):
    return builder.extract_value(context.make_array(array_type)(context, builder, array).shape, axis)


def _fma(builder):
    return cgutils.get_or_insert_function(builder.module, ir.FunctionType(FLOATS, [FLOATS] * 3),
                                          "llvm.fma.v16f32")


MAX_KEY_ROWS = 8  # key_scores' rows at most
# key_scores' blocks at a time and its sums held in registers a pass: a (row, block)
# sum is one chain of FMAs over d, so a decode token's 2-4 rows against one block at a
# time waited on the FMA's latency (~32 cycles a key at 2 rows); 4 blocks give 4x the
# chains, each summed as before (AVX2: 4 sums, 8 ymm registers)
BLOCKS_A_PASS, SUMS_A_PASS = 4, 16 if HAS_AVX512 else 4


def _for_each_row_count(builder, n_rows, code_for):
    """code_for(rows) for each count 1 .. MAX_KEY_ROWS, the one run chosen by n_rows (a
    switch): each count's sums are registers of their own."""
    done = builder.append_basic_block("rows.done")
    choose = builder.switch(n_rows, done)
    for rows in range(1, MAX_KEY_ROWS + 1):
        case = builder.append_basic_block(f"rows.{rows}")
        choose.add_case(index(rows), case)
        builder.position_at_end(case)
        code_for(rows)
        builder.branch(done)
    builder.position_at_end(done)


@intrinsic
def key_scores(typingctx, q_rows, n_rows, k_blocks, scores, col):
    """scores[r, col + 16 b + j] = sum_d q_rows[r, d] * K_b[d, j] for r < n_rows (1 .. 8)
    and the 16 keys j of each block b of k_blocks (a tuple of 1 .. BLOCKS_A_PASS): the
    pool's blocks of one KV head, (D, 16) float32 values or float16 bits (uint16), or
    (D + D/16, 16) int8 (kv_q8.py's rows, transposed: the scores of each 32 dimensions
    times the keys' scales). D = q_rows.shape[1]. Each (row, block) sum runs over d in
    order, whatever else is scored beside it: the same bits one block at a time."""
    if not (_float_matrix(q_rows) and _float_matrix(scores) and isinstance(k_blocks, types.UniTuple)
            and 1 <= len(k_blocks) <= BLOCKS_A_PASS and k_blocks.dtype.ndim == 2
            and c_array(k_blocks.dtype, (types.float32, types.uint16, types.int8))):
        return None
    signature = types.void(q_rows, types.intp, k_blocks, scores, types.intp)
    n_blocks = len(k_blocks)

    def codegen(context, builder, sig, args):
        q_arr, n_rows, k_tuple, s_arr, col = args
        t_q, _, t_tuple, t_s, _ = sig.args
        t_k, k_arrs = t_tuple.dtype, cgutils.unpack_tuple(builder, k_tuple, n_blocks)
        q_width, s_width = _shape(context, builder, t_q, q_arr, 1), _shape(context, builder, t_s, s_arr, 1)
        fma = _fma(builder)
        quantized = t_k.dtype == types.int8

        def partial(sums, rows, d0, d1):
            """sums[r][b] += sum over d0 <= d < d1 of q[r, d] * K_b[d, :], for r in rows."""
            with cgutils.for_range_slice(builder, d0, d1, index(1)) as (d, _):
                keys = [_pool_vector(context, builder, t_k, k, builder.mul(d, index(LANES)), t_k.dtype)
                        for k in k_arrs]
                for r in rows:
                    q = splat(builder, builder.load(pointer(context, builder, t_q, q_arr,
                                                            builder.add(builder.mul(index(r), q_width), d))), FLOATS)
                    for b, k in enumerate(keys):
                        builder.store(builder.call(fma, [q, k, builder.load(sums[r][b])]), sums[r][b])

        def rows_of(n):
            """The code for exactly n rows, SUMS_A_PASS (row, block) sums in registers a pass."""
            def zeros():
                return {r: [cgutils.alloca_once_value(builder, ir.Constant(FLOATS, [0.0] * LANES))
                            for _ in range(n_blocks)] for r in range(n)}
            sums = zeros()
            step = max(1, SUMS_A_PASS // n_blocks)
            for rows in [range(r0, min(n, r0 + step)) for r0 in range(0, n, step)]:
                if not quantized:
                    partial(sums, rows, index(0), q_width)
                    continue
                chunk = zeros()  # each 32 dimensions' dot, times the keys' scales (rows D + 2c, D + 2c + 1)
                with cgutils.for_range(builder, builder.udiv(q_width, index(KV_BLOCK))) as blocks:
                    c = blocks.index
                    for r in rows:
                        for part in chunk[r]:
                            builder.store(ir.Constant(FLOATS, [0.0] * LANES), part)
                    partial(chunk, rows, builder.mul(c, index(KV_BLOCK)),
                            builder.mul(builder.add(c, index(1)), index(KV_BLOCK)))
                    at = builder.mul(builder.add(q_width, builder.mul(c, index(2))), index(LANES))
                    scales = [_scales_of_keys(context, builder, t_k, k, at) for k in k_arrs]
                    for r in rows:
                        for s, part, scale in zip(sums[r], chunk[r], scales):
                            builder.store(builder.call(fma, [builder.load(part), scale, builder.load(s)]), s)
            for r in range(n):
                for b, s in enumerate(sums[r]):
                    at = builder.add(builder.mul(index(r), s_width), builder.add(col, index(LANES * b)))
                    builder.store(builder.load(s), pointer(context, builder, t_s, s_arr, at, FLOATS), align=4)

        _for_each_row_count(builder, n_rows, rows_of)
        return context.get_dummy_value()
    return signature, codegen


def _add_weighted(builder, fma, sums, weights, values) -> None:
    """sums[r][c] += weights[r] * values[c] (a float32 weight a row, vectors of V)."""
    for r, weight in enumerate(weights):
        weight = splat(builder, weight, FLOATS)
        for c, value in enumerate(values):
            builder.store(builder.call(fma, [weight, value, builder.load(sums[r][c])]), sums[r][c])


def _store_sums(builder, sums, at) -> None:
    """The sums held in registers (allocas) back to their places in acc."""
    for row, places in zip(sums, at):
        for s, place in zip(row, places):
            builder.store(builder.load(s), place, align=4)


def _pool_vector(context, builder, array_type, array, at, dtype):
    """16 values of a KV pool from element `at` (flat), as float32: float16 bits widened,
    int8 values (kv_q8.py's, before their scale) converted."""
    if dtype == types.uint16:
        bits = builder.load(pointer(context, builder, array_type, array, at,
                                    ir.VectorType(ir.IntType(16), LANES)), align=2)
        return builder.fpext(builder.bitcast(bits, ir.VectorType(ir.HalfType(), LANES)), FLOATS)
    if dtype == types.int8:
        values = builder.load(pointer(context, builder, array_type, array, at,
                                      ir.VectorType(ir.IntType(8), LANES)), align=1)
        return builder.sitofp(values, FLOATS)
    return builder.load(pointer(context, builder, array_type, array, at, FLOATS), align=4)


def _half_of_bytes(builder, low, high):
    """float32 of float16s given as their low and high bytes (int8 vectors, or scalars)."""
    vector = isinstance(low.type, ir.VectorType)
    shorts = ir.VectorType(ir.IntType(16), LANES) if vector else ir.IntType(16)
    halfs = ir.VectorType(ir.HalfType(), LANES) if vector else ir.HalfType()
    eight = ir.Constant(shorts, [8] * LANES) if vector else ir.Constant(shorts, 8)
    bits = builder.or_(builder.zext(low, shorts), builder.shl(builder.zext(high, shorts), eight))
    return builder.fpext(builder.bitcast(bits, halfs), FLOATS if vector else ir.FloatType())


def _scales_of_keys(context, builder, array_type, array, at):
    """The 16 keys' scales whose low bytes are the row at flat element `at` of an int8 K
    block (their high bytes the next row), as float32."""
    row = ir.VectorType(ir.IntType(8), LANES)
    low = builder.load(pointer(context, builder, array_type, array, at, row), align=1)
    high = builder.load(pointer(context, builder, array_type, array, builder.add(at, index(LANES)), row),
                        align=1)
    return _half_of_bytes(builder, low, high)


@intrinsic
def weigh_keys(typingctx, weights, col, n_rows, v_block, kvh, first, n_keys, acc):
    """acc[r, :] += sum_{j < n_keys} weights[r, col + j] * V[first + j, kvh, :] for r <
    n_rows (1 .. 8); v_block (block_size, n_kv, W) the pool's block (float32, float16 bits
    as uint16, or int8: kv_q8.py's rows, W = D + D/16), acc (>= n_rows, D) float32, D a
    multiple of 16."""
    if not (_float_matrix(weights) and _float_matrix(acc) and v_block.ndim == 3
            and c_array(v_block, (types.float32, types.uint16, types.int8))):
        return None
    signature = types.void(weights, types.intp, types.intp, v_block, types.intp, types.intp,
                           types.intp, acc)

    def codegen(context, builder, sig, args):
        w_arr, col, n_rows, v_arr, kvh, first, n_keys, a_arr = args
        t_w, _, _, t_v, _, _, _, t_a = sig.args
        n_kv, row_width = _shape(context, builder, t_v, v_arr, 1), _shape(context, builder, t_v, v_arr, 2)
        head_dim = _shape(context, builder, t_a, a_arr, 1)
        w_width = _shape(context, builder, t_w, w_arr, 1)

        def values_of(row_at, vector):
            """Vector `vector` (16 values) of the V row at flat element row_at, as float32:
            an int8 row's values times their block's scale."""
            values = _pool_vector(context, builder, t_v, v_arr,
                                  builder.add(row_at, builder.mul(vector, index(LANES))), t_v.dtype)
            if t_v.dtype != types.int8:
                return values
            block = builder.udiv(builder.mul(vector, index(LANES)), index(KV_BLOCK))  # (its scale's)
            scale_at = builder.add(row_at, builder.add(head_dim, builder.mul(block, index(2))))
            low = builder.load(pointer(context, builder, t_v, v_arr, scale_at))
            high = builder.load(pointer(context, builder, t_v, v_arr, builder.add(scale_at, index(1))))
            return builder.fmul(values, splat(builder, _half_of_bytes(builder, low, high), FLOATS))
        fma = _fma(builder)

        def rows_of(rows):
            columns = max(1, min(2 * VECTORS_A_PASS, 16 // rows)) if HAS_AVX512 else 1  # sums in registers

            def pass_of(c0, width):
                at_acc = [[pointer(context, builder, t_a, a_arr,
                                   builder.add(builder.mul(index(r), head_dim),
                                               builder.mul(builder.add(c0, index(c)), index(LANES))), FLOATS)
                           for c in range(width)] for r in range(rows)]
                sums = [[cgutils.alloca_once_value(builder, builder.load(at_acc[r][c], align=4))
                         for c in range(width)] for r in range(rows)]
                with cgutils.for_range(builder, n_keys) as keys:
                    j = keys.index
                    row_at = builder.mul(builder.add(builder.mul(builder.add(first, j), n_kv), kvh), row_width)
                    values = [values_of(row_at, builder.add(c0, index(c))) for c in range(width)]
                    weights = [builder.load(pointer(context, builder, t_w, w_arr, builder.add(
                        builder.mul(index(r), w_width), builder.add(col, j)))) for r in range(rows)]
                    _add_weighted(builder, fma, sums, weights, values)
                _store_sums(builder, sums, at_acc)

            vectors = builder.udiv(head_dim, index(LANES))
            whole = builder.udiv(vectors, index(columns))
            with cgutils.for_range(builder, whole) as passes:
                pass_of(builder.mul(passes.index, index(columns)), columns)
            with cgutils.for_range(builder, builder.urem(vectors, index(columns))) as rest:
                pass_of(builder.add(builder.mul(whole, index(columns)), rest.index), 1)

        _for_each_row_count(builder, n_rows, rows_of)
        return context.get_dummy_value()
    return signature, codegen


@intrinsic
def score_tile(typingctx, q_t, kbuf, n_keys, scores):
    """scores[j, r] = sum_d kbuf[j, d] * q_t[d, r] for j < n_keys (rounded up to 8: kbuf
    has KEYS rows) and every r < Rp = q_t.shape[1] (a multiple of 16)."""
    if not (_float_matrix(q_t) and _float_matrix(kbuf) and _float_matrix(scores)):
        return None
    signature = types.void(q_t, kbuf, types.intp, scores)

    def codegen(context, builder, sig, args):
        q_arr, k_arr, n_keys, s_arr = args
        t_q, t_k, _, t_s = sig.args
        head_dim, padded = _shape(context, builder, t_q, q_arr, 0), _shape(context, builder, t_q, q_arr, 1)
        k_width = _shape(context, builder, t_k, k_arr, 1)
        fma = _fma(builder)
        sums = [cgutils.alloca_once(builder, FLOATS) for _ in range(KEYS_A_PASS)]
        passes = builder.udiv(builder.add(n_keys, index(KEYS_A_PASS - 1)), index(KEYS_A_PASS))
        with cgutils.for_range(builder, builder.udiv(padded, index(LANES))) as rows:
            r0 = builder.mul(rows.index, index(LANES))
            with cgutils.for_range(builder, passes) as keys:
                j0 = builder.mul(keys.index, index(KEYS_A_PASS))
                for s in sums:
                    builder.store(ir.Constant(FLOATS, [0.0] * LANES), s)
                with cgutils.for_range(builder, head_dim) as dims:
                    d = dims.index
                    q = builder.load(pointer(context, builder, t_q, q_arr,
                                             builder.add(builder.mul(d, padded), r0), FLOATS), align=4)
                    for u, s in enumerate(sums):
                        at = builder.add(builder.mul(builder.add(j0, index(u)), k_width), d)
                        k = splat(builder, builder.load(pointer(context, builder, t_k, k_arr, at)), FLOATS)
                        builder.store(builder.call(fma, [k, q, builder.load(s)]), s)
                for u, s in enumerate(sums):
                    at = builder.add(builder.mul(builder.add(j0, index(u)), padded), r0)
                    builder.store(builder.load(s), pointer(context, builder, t_s, s_arr, at, FLOATS), align=4)
        return context.get_dummy_value()
    return signature, codegen


@intrinsic
def weigh_values(typingctx, scores, vbuf, n_keys, acc):
    """acc[r, d] += sum_{j < n_keys} scores[j, r] * vbuf[j, d] for every r < Rp =
    acc.shape[0] (a multiple of 16) and d < D = acc.shape[1] (a multiple of 16)."""
    if not (_float_matrix(scores) and _float_matrix(vbuf) and _float_matrix(acc)):
        return None
    signature = types.void(scores, vbuf, types.intp, acc)

    def codegen(context, builder, sig, args):
        s_arr, v_arr, n_keys, a_arr = args
        t_s, t_v, _, t_a = sig.args
        padded, head_dim = _shape(context, builder, t_a, a_arr, 0), _shape(context, builder, t_a, a_arr, 1)
        s_width, v_width = _shape(context, builder, t_s, s_arr, 1), _shape(context, builder, t_v, v_arr, 1)
        fma = _fma(builder)

        def pass_of(r0, c0, columns):
            """Rows r0 .. r0 + 3, vectors c0 .. c0 + columns - 1 of D (16 floats each)."""
            sums = [[cgutils.alloca_once(builder, FLOATS) for _ in range(columns)]
                    for _ in range(ROWS_A_PASS)]
            at_acc = [[pointer(context, builder, t_a, a_arr,
                               builder.add(builder.mul(builder.add(r0, index(r)), head_dim),
                                           builder.mul(builder.add(c0, index(c)), index(LANES))), FLOATS)
                       for c in range(columns)] for r in range(ROWS_A_PASS)]
            for r in range(ROWS_A_PASS):
                for c in range(columns):
                    builder.store(builder.load(at_acc[r][c], align=4), sums[r][c])
            with cgutils.for_range(builder, n_keys) as keys:
                j = keys.index
                values = [builder.load(pointer(context, builder, t_v, v_arr,
                                                builder.add(builder.mul(j, v_width),
                                                            builder.mul(builder.add(c0, index(c)), index(LANES))),
                                                FLOATS), align=4) for c in range(columns)]
                weights = [builder.load(pointer(context, builder, t_s, s_arr, builder.add(
                    builder.mul(j, s_width), builder.add(r0, index(r))))) for r in range(ROWS_A_PASS)]
                _add_weighted(builder, fma, sums, weights, values)
            _store_sums(builder, sums, at_acc)

        vectors = builder.udiv(head_dim, index(LANES))
        wide = builder.icmp_unsigned("==", builder.urem(vectors, index(VECTORS_A_PASS)), index(0))
        with cgutils.for_range(builder, builder.udiv(padded, index(ROWS_A_PASS))) as rows:
            r0 = builder.mul(rows.index, index(ROWS_A_PASS))
            with builder.if_else(wide) as (several_at_once, one_at_once):
                with several_at_once:
                    with cgutils.for_range(builder, builder.udiv(vectors, index(VECTORS_A_PASS))) as cols:
                        pass_of(r0, builder.mul(cols.index, index(VECTORS_A_PASS)), VECTORS_A_PASS)
                with one_at_once:
                    with cgutils.for_range(builder, vectors) as cols:
                        pass_of(r0, cols.index, 1)
        return context.get_dummy_value()
    return signature, codegen
