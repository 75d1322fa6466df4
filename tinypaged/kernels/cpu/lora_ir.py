"""LLVM IR for LoRA's expand on the CPU (lora.py): four rows' terms times one slot's
B^T, 16 outputs at a time with each output's sum held in a register across all the
ranks. Numba's own loop over the outputs widened B^T's float16 one vector per four
of the rows' products and reloaded y for every four ranks (~20 GMAC/s a core on
Zen 4, bench/NOTES.md); here each B^T vector read serves the four rows and y is
written once."""
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from .vector_ir import FLOATS, IR_F32, LANES, c_array, index, pointer, splat

ROWS = 4  # rows of one slot taken together (lora.py; and model.lora_slots.RANK_PADDING)
_HALVES = ir.VectorType(ir.HalfType(), LANES)


@intrinsic
def expand_lanes(typingctx, t, bt, r4, out, chunks):
    """out[q, 16 c .. 16 c + 15] = sum over j < r4 of t[q, j] * bt[j, 16 c .. 16 c + 15]
    for q < 4 and c < chunks, the ranks in order (one fma each: the same bits for a row
    whatever the others). t (4, R) float32, bt (R', N) float32 or float16 bits (uint16),
    out (4, M) float32, all C-contiguous; chunks * 16 <= N, M."""
    if not (c_array(t, (types.float32,)) and t.ndim == 2 and c_array(bt, (types.float32, types.uint16))
            and bt.ndim == 2 and c_array(out, (types.float32,)) and out.ndim == 2
            and isinstance(r4, types.Integer) and isinstance(chunks, types.Integer)):
        return None
    half_bits = bt.dtype == types.uint16

    def codegen(context, builder, sig, args):
        t_arr, bt_arr, r4_v, out_arr, chunks_v = args
        t_ty, bt_ty, _, out_ty, _ = sig.args
        t_width = cgutils.unpack_tuple(builder, context.make_array(t_ty)(context, builder, t_arr).shape, 2)[1]
        n = cgutils.unpack_tuple(builder, context.make_array(bt_ty)(context, builder, bt_arr).shape, 2)[1]
        m = cgutils.unpack_tuple(builder, context.make_array(out_ty)(context, builder, out_arr).shape, 2)[1]
        fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(FLOATS, [FLOATS] * 3), "llvm.fma.v16f32")
        with cgutils.for_range(builder, chunks_v) as chunk:
            o = builder.mul(chunk.index, index(LANES))
            sums = [cgutils.alloca_once_value(builder, ir.Constant(FLOATS, [0.0] * LANES)) for _ in range(ROWS)]
            with cgutils.for_range(builder, r4_v) as rank:
                j = rank.index
                at = builder.add(builder.mul(j, n), o)
                if half_bits:
                    bits = builder.load(pointer(context, builder, bt_ty, bt_arr, at, _HALVES), align=2)
                    b = builder.fpext(bits, FLOATS)
                else:
                    b = builder.load(pointer(context, builder, bt_ty, bt_arr, at, FLOATS), align=4)
                for q in range(ROWS):
                    tq = builder.load(pointer(context, builder, t_ty, t_arr,
                                              builder.add(builder.mul(index(q), t_width), j), IR_F32))
                    builder.store(builder.call(fma, [splat(builder, tq, FLOATS), b, builder.load(sums[q])]), sums[q])
            for q in range(ROWS):
                at = builder.add(builder.mul(index(q), m), o)
                builder.store(builder.load(sums[q]), pointer(context, builder, out_ty, out_arr, at, FLOATS), align=4)
        return context.get_dummy_value()
    return types.void(t, bt, types.intp, out, types.intp), codegen
