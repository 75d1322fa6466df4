"""The widening of every narrow weight kind to float32 rows, written once: the GEMM
(gemm.py) widens four rows at a time into L1, the BLAS tiles (quantized.py) a
tile at a time.

Weight (n, k), by kind (model/packed.py has the packed layouts):
    F32   w[n, k];  F16, BF16   bits[n, k] widened
    Q8_0  scale * q;  Q4_0  scale * (q - 8);  Q4_1  scale * q + min
The float32 operations are PackedWeight.dequantize's: under a kernel without
fastmath the rows equal it bit for bit.
"""
import numpy as np
from numba import float32, types
from numba.extending import overload

from ...model.ggml_quant import BF16, F16, F32, Q4_1
from .common import bf16_bits_to_f32, f16_bits_to_f32

EIGHT = float32(8.0)


def kind_arguments(kind: int, scales, mins) -> tuple:
    """(scales, mins) as widen_rows tells the kinds apart: None where a kind has none
    (F32, F16, BF16: neither; Q8_0, Q4_0: no mins)."""
    unscaled = kind in (F32, F16, BF16)
    return None if unscaled else scales, mins if kind == Q4_1 else None


def widen_rows(quants, scales, mins, first, w):
    """w (r, K) float32 = rows first .. first + r - 1 of W. Compiled per kind
    (below), chosen by the types of the arguments (quants' dtype; mins None or not):
    one kernel per kind, each with its own vectorized loops. A runtime branch on the
    kind, even Q4_0 against Q4_1, left some of them scalar (2-4x slower)."""
    raise NotImplementedError("numba-only: see the overload below")


@overload(widen_rows, inline="always")
def _widen_rows_by_type(quants, scales, mins, first, w):
    if quants.dtype == types.float32:  # F32: the matrix itself
        def widen(quants, scales, mins, first, w):
            for r in range(w.shape[0]):
                for k in range(w.shape[1]):
                    w[r, k] = quants[first + r, k]
    elif quants.dtype == types.int16:  # BF16: its bits (held as int16 to tell them apart)
        def widen(quants, scales, mins, first, w):
            for r in range(w.shape[0]):
                for k in range(w.shape[1]):
                    w[r, k] = bf16_bits_to_f32(quants[first + r, k])
    elif quants.dtype == types.uint16:  # F16: its bits
        def widen(quants, scales, mins, first, w):
            for r in range(w.shape[0]):
                for k in range(w.shape[1]):
                    w[r, k] = f16_bits_to_f32(quants[first + r, k])
    elif quants.dtype == types.int8:  # Q8_0
        def widen(quants, scales, mins, first, w):
            for r in range(w.shape[0]):
                n = first + r
                for k in range(w.shape[1]):
                    w[r, k] = f16_bits_to_f32(scales[n, k >> 5]) * float32(quants[n, k])
    elif isinstance(mins, types.NoneType):  # Q4_0: byte p holds weights p and K/2 + p
        def widen(quants, scales, mins, first, w):
            half = w.shape[1] >> 1
            for r in range(w.shape[0]):
                n = first + r
                upper = half >> 5  # the block holding weight K/2 (K is a multiple of 64)
                for k in range(half):
                    w[r, k] = f16_bits_to_f32(scales[n, k >> 5]) * (
                        float32(quants[n, k] & np.uint8(15)) - EIGHT)
                for k in range(half):
                    w[r, half + k] = f16_bits_to_f32(scales[n, upper + (k >> 5)]) * (
                        float32(quants[n, k] >> np.uint8(4)) - EIGHT)
    else:  # Q4_1
        def widen(quants, scales, mins, first, w):
            half = w.shape[1] >> 1
            for r in range(w.shape[0]):
                n = first + r
                upper = half >> 5
                for k in range(half):
                    w[r, k] = (f16_bits_to_f32(scales[n, k >> 5]) * float32(quants[n, k] & np.uint8(15))
                               + f16_bits_to_f32(mins[n, k >> 5]))
                for k in range(half):
                    b = upper + (k >> 5)
                    w[r, half + k] = (f16_bits_to_f32(scales[n, b]) * float32(quants[n, k] >> np.uint8(4))
                                      + f16_bits_to_f32(mins[n, b]))
    return widen
