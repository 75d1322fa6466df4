"""Activations rounded to int8 per 32-block, for products with packed weights.

A packed (Q8_0 / Q4_0 / Q4_1) weight multiplies x rounded as llama.cpp rounds it:
per block of 32 values, d = max|x| / 127 and q = round-half-even(x / d) in int8, so
x is taken as d * q. The kernels then compute each block's dot product in
integers (quantized.py, packed_gemm.py); the NumPy spec is
reference.quantize_activations / round_activations.

The rounding is done once per row of x in plain njit code (no fastmath): it must
equal the NumPy spec bit for bit. Cost: one pass over x, microseconds.
"""
import numpy as np
from numba import float32, int32, njit

BLOCK = 32  # activations per scale, as the weights' blocks
_MAX_Q = float32(127.0)


@njit(cache=True)
def quantize_activations(x, padded_rows=0):
    """x (M, K) float32, K a multiple of 32 -> q (R, K) int8, d (R, K/32) float32 (the
    blocks' scales), qsum (R, K/32) int32 (each block's sum of q), R = max(M,
    padded_rows): rows after M are zeros (kernels that take rows 8 at a time)."""
    n_rows, width = x.shape
    n_blocks = width // BLOCK
    rows = max(n_rows, padded_rows)
    q = np.zeros((rows, width), dtype=np.int8)
    d = np.zeros((rows, n_blocks), dtype=np.float32)
    qsum = np.zeros((rows, n_blocks), dtype=np.int32)
    for m in range(n_rows):
        for b in range(n_blocks):
            k0 = b * BLOCK
            amax = float32(0.0)
            for k in range(k0, k0 + BLOCK):
                amax = max(amax, abs(x[m, k]))
            scale = float32(amax / _MAX_Q)  # (numba divides float32s in float64: round once)
            inverse = float32(float32(1.0) / scale) if scale > 0 else float32(0.0)
            total = int32(0)
            for k in range(k0, k0 + BLOCK):
                v = np.int8(np.rint(x[m, k] * inverse))  # (float32 * float32 stays float32)
                q[m, k] = v
                total += v
            d[m, b] = scale
            qsum[m, b] = total
    return q, d, qsum
