"""What the CPU kernels share: the float16 and bfloat16 widening intrinsics and the
work split."""
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

N_CHUNKS = 64  # work items per parallel call: rows of W are split into this many ranges


@intrinsic
def f16_bits_to_f32(typingctx, bits):
    """uint16 holding an IEEE half -> float32 (exact; vectorises to vcvtph2ps)."""
    sig = types.float32(types.uint16)

    def codegen(context, builder, signature, args):
        return builder.fpext(builder.bitcast(args[0], ir.HalfType()), ir.FloatType())
    return sig, codegen


@intrinsic
def bf16_bits_to_f32(typingctx, bits):
    """int16 holding a bfloat16's bits -> float32 (exact: the bits become the top
    half of the float32; vectorises to a zero-extend and a shift)."""
    sig = types.float32(types.int16)

    def codegen(context, builder, signature, args):
        wide = builder.shl(builder.zext(args[0], ir.IntType(32)), ir.Constant(ir.IntType(32), 16))
        return builder.bitcast(wide, ir.FloatType())
    return sig, codegen
