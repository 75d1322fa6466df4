"""What the CPU kernels share: the float16 widening intrinsic and the work split."""
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
