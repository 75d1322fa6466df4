"""LLVM IR for the two products of a many-row attention item (attention_items.py):
scores = K q for a tile's rows, and acc += weights V. Written as small register-blocked
matrix products, because numba's loops keep their running sums in memory: each FMA
then also loads and stores a sum, and the item ran at ~7 multiply-adds a cycle.

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
                for r in range(ROWS_A_PASS):
                    at = builder.add(builder.mul(j, s_width), builder.add(r0, index(r)))
                    weight = splat(builder, builder.load(pointer(context, builder, t_s, s_arr, at)), FLOATS)
                    for c in range(columns):
                        builder.store(builder.call(fma, [weight, values[c], builder.load(sums[r][c])]),
                                      sums[r][c])
            for r in range(ROWS_A_PASS):
                for c in range(columns):
                    builder.store(builder.load(sums[r][c]), at_acc[r][c], align=4)

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
