"""Float32 arithmetic that NVVM may not contract: a product rounded to float32
before it is added, as NumPy and the CPU kernels compute it.

NVVM fuses `a * b + c` into one FMA, which rounds once where the reference rounds
twice: the result can differ in the last bit. Where a kernel promises the
reference's bits (rounding x to int8 steps, RoPE's write of K into the pool, both
checked bit for bit), its products and sums go through these. Elsewhere FMAs are
welcome: they are faster and, if anything, more accurate.

On the simulator (plain Python on NumPy float32 scalars) nothing is ever fused, so
the plain operators are the same arithmetic.
"""
import math

from numba import config, float32

NEG_INF = float32(-math.inf)  # a score that counts for nothing

if config.ENABLE_CUDASIM:
    def mul_rn(a, b):
        return float32(a * b)

    def add_rn(a, b):
        return float32(a + b)

    def sub_rn(a, b):
        return float32(a - b)
else:
    from numba.cuda import libdevice

    mul_rn, add_rn, sub_rn = libdevice.fmul_rn, libdevice.fadd_rn, libdevice.fsub_rn
