"""The float arithmetic of a product with a packed weight, written once, so that every
kernel computing it gives the same bits: a row's result then does not depend on
how many rows were multiplied with it (which kernel ran), and greedy output does
not depend on the batch.

With x rounded to int8 blocks (activations.py: scale dx, values qx, sum qsum) and
W's block b of row n holding integers w (Q8_0: q; Q4_0: q - 8; Q5_0: q - 16;
Q4_1, Q5_1, Q4_K and Q5_K: q, plus a min; Q6_K: sc * (q - 32), sc the int8 scale
of each 16 weights; scale_of and min_of give a block's float32 scale and min),
out[m, n] is, with blocks taken in order b = 0, 1, ...:

    acc = 0
    acc = fma(dx, block_term(...), acc)   where, with dot = sum of w * qx over the block,
        Q8_0, Q4_0, Q5_0, Q6_K:  scale * dot
        Q4_1, Q5_1, Q4_K, Q5_K:  fma(min, qsum, scale * dot)

fma(a, b, c) is a * b + c rounded once (common.fma32, llvm.fma in the vector
kernels). Per block and row of x that is 3 float operations with a min, 2 without:
the epilogue the batched kernels pay for every row of x beside their 8 vpdpbusd,
so x's scale goes in last, fused with the sum (bench/NOTES.md).

`dot` is an exact integer in every kernel: the decode GEMV takes it from an integer
dot product (int8_dot.py), the group GEMM from vpdpbusd or from float32
multiply-adds of small integers, exact below 2^24 (at most 32 * 255 * 127 here)
(group_ir.py). Only block_term and the fma into acc round: the same operations in
the numba kernels and in the vector lanes of group_ir and lanes_ir, in the same
order, never under fastmath (which would let LLVM reorder the sum over blocks
differently in each kernel). The tests hold every kernel to the GEMV's bits.
"""
from numba import float32, types
from numba.extending import overload

from .common import f16_bits_to_f32, fma32


def block_term(scale, mins, min_value, dot, qsum):
    """One block's float32 term before x's scale (see the module docstring): the
    caller adds fma32(dx, term, acc). mins: the weight's mins array, or None (Q8_0,
    Q4_0): chosen at compile time by its type; min_value: this block's min (unread
    when mins is None)."""
    raise NotImplementedError("numba-only: see the overload below")


@overload(block_term, inline="always")
def _block_term_by_kind(scale, mins, min_value, dot, qsum):
    if isinstance(mins, types.NoneType):
        def term(scale, mins, min_value, dot, qsum):
            return scale * float32(dot)
    else:
        def term(scale, mins, min_value, dot, qsum):
            return fma32(min_value, float32(qsum), scale * float32(dot))
    return term


def is_q6_k(scales) -> bool:
    """Whether a packed weight's scales (a numba type) are Q6_K's int8 sub-scales."""
    return isinstance(scales, types.Array) and scales.dtype == types.int8


def scale_of(scales, supers, n, b):
    """Block b of row n's scale in float32: scales[n, b] as float16 bits; for Q4_K and
    Q5_K (supers given) d * sc, exact in float32 (formats/packed.py); for Q6_K d alone
    (its sub-scales are in the block's integer dot)."""
    raise NotImplementedError("numba-only: see the overload below")


@overload(scale_of, inline="always")
def _scale_of_by_kind(scales, supers, n, b):
    if isinstance(supers, types.NoneType):
        return lambda scales, supers, n, b: f16_bits_to_f32(scales[n, b])
    if is_q6_k(scales):
        return lambda scales, supers, n, b: f16_bits_to_f32(supers[n, b >> 3, 0])
    return lambda scales, supers, n, b: f16_bits_to_f32(supers[n, b >> 3, 0]) * float32(scales[n, b])


def min_of(mins, supers, n, b):
    """Block b of row n's min in float32: 0 when mins is None (Q8_0, Q4_0), mins[n, b]
    as float16 bits (Q4_1), or -(dmin * m) for Q4_K (supers given), exact."""
    raise NotImplementedError("numba-only: see the overload below")


@overload(min_of, inline="always")
def _min_of_by_kind(mins, supers, n, b):
    if isinstance(mins, types.NoneType):
        return lambda mins, supers, n, b: float32(0.0)
    if isinstance(supers, types.NoneType):
        return lambda mins, supers, n, b: f16_bits_to_f32(mins[n, b])
    return lambda mins, supers, n, b: -(f16_bits_to_f32(supers[n, b >> 3, 1]) * float32(mins[n, b]))


def _nibble_offset(scales, mins, highs) -> int:
    if is_q6_k(scales) or not isinstance(mins, types.NoneType):
        return 0
    return 8 if isinstance(highs, types.NoneType) else 16


def nibble_offset(scales, mins, highs):
    """What a Q4 / Q5 kind subtracts from its q: 8 for Q4_0 (mins None), 16 for Q5_0
    (mins None, highs given), 0 for the kinds with mins and for Q6_K (whose 32 goes
    with its sub-scales, inside the block's dot)."""
    raise NotImplementedError("numba-only: see the overload below")


@overload(nibble_offset, inline="always")
def _nibble_offset_by_kind(scales, mins, highs):
    offset = _nibble_offset(scales, mins, highs)
    return lambda scales, mins, highs: offset


def dot_offset(quants, scales, mins, highs):
    """What a kernel subtracts, times the block's sum of x, from dots of the weights'
    unsigned bytes: 128 for Q8_0 (int8 quants, read xor 128), then as nibble_offset."""
    raise NotImplementedError("numba-only: see the overload below")


@overload(dot_offset, inline="always")
def _dot_offset_by_kind(quants, scales, mins, highs):
    offset = 128 if quants.dtype == types.int8 else _nibble_offset(scales, mins, highs)
    return lambda quants, scales, mins, highs: offset


def flat_bits(highs):
    """Q5_x's fifth bits (N, K/8) or Q6_K's top bits (N, K/4) as one flat byte array, or
    None for the other kinds."""
    raise NotImplementedError("numba-only: see the overload below")


@overload(flat_bits, inline="always")
def _flat_bits_or_none(highs):
    if isinstance(highs, types.NoneType):
        return lambda highs: None
    return lambda highs: highs.reshape(-1)
