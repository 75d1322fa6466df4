"""What the CPU kernels share: the float16 and bfloat16 widening intrinsics, the
float16 KV pool's element conversions, and the work split."""
import llvmlite.binding as llvm
from llvmlite import ir
from numba import config as numba_config
from numba import types
from numba.extending import intrinsic, overload

N_CHUNKS = 64  # work items per parallel call: rows of W are split into this many ranges
# rows of x up to which a packed matrix's GEMV beats laying x out for its GEMM
PACKED_GEMV_MAX_ROWS = 2
# the packed products' ranges of rows of W: a few long streams from memory, each pass
# hinting the bytes ahead (Llama-3.2-1B: the batch-1 step 33.9 -> 32.2 ms, the 32-row
# gate/up 277 -> 305 GMAC/s against N_CHUNKS' 64: bench/NOTES.md 2026-12-05)
PACKED_RANGES = 4


def _compiled_for_host() -> bool:
    """Whether numba compiles for this CPU (its default), not for the CPU named by its
    own NUMBA_CPU_NAME setting (as when measuring an AVX2 laptop's code paths here)."""
    return numba_config.CPU_NAME in (None, "host")


def _features() -> dict:
    """This CPU's features, or under NUMBA_CPU_NAME those NUMBA_CPU_FEATURES names with a
    "+" (so the AVX2 kernels can be compiled and run on an AVX-512 machine: tests)."""
    if _compiled_for_host():
        return llvm.get_host_cpu_features()
    named = (numba_config.CPU_FEATURES or "").split(",")
    return {name[1:]: True for name in named if name.startswith("+")}


_FEATURES = _features()
# vpdpbusd on 512- and 256-bit vectors: the kernels that name it have a generic twin
HAS_VNNI = bool(_FEATURES.get("avx512vnni", False) and _FEATURES.get("avx512vl", False))
# vpmaddubsw / vpmaddwd on 256-bit vectors, vfmadd and vcvtph2ps: the lanes kernels' AVX2 form
HAS_AVX2 = all(_FEATURES.get(name, False) for name in ("avx2", "fma", "f16c"))
# 32 vector registers of 512 bits (register-blocked kernels size their sums by it); under
# NUMBA_CPU_NAME without avx512f named, the smaller AVX2 shapes, right for either
HAS_AVX512 = bool(_FEATURES.get("avx512f", False))


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


@intrinsic
def f32_to_f16_bits(typingctx, value):
    """float32 -> the uint16 bits of the nearest IEEE half (round half to even, as
    NumPy's astype(float16); vectorises to vcvtps2ph)."""
    sig = types.uint16(types.float32)

    def codegen(context, builder, signature, args):
        return builder.bitcast(builder.fptrunc(args[0], ir.HalfType()), ir.IntType(16))
    return sig, codegen


def kv_widen(x):
    """A KV pool element as float32 (a float16 pool holds uint16 bits)."""


@overload(kv_widen, inline="always")
def _kv_widen(x):
    if x == types.uint16:
        return lambda x: f16_bits_to_f32(x)
    return lambda x: x


def kv_narrow(value, pool):
    """A float32 value as pool's element (float16 bits for a float16 pool)."""


@overload(kv_narrow, inline="always")
def _kv_narrow(value, pool):
    if pool.dtype == types.uint16:
        return lambda value, pool: f32_to_f16_bits(value)
    return lambda value, pool: value
