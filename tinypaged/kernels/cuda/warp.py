"""Warp-wide reductions (device functions): every lane gets the result, and the
order of the additions is the same on every run (a butterfly of shfl_xor_sync),
unlike atomics into shared memory."""
from numba import cuda

from .device_function import device_function

WARP = 32  # threads a warp
FULL_MASK = 0xFFFFFFFF  # every lane of a warp takes part


@device_function
def warp_sum(value):
    """Sum over the 32 lanes of a warp."""
    offset = 16
    while offset > 0:
        value += cuda.shfl_xor_sync(FULL_MASK, value, offset)
        offset //= 2
    return value


@device_function
def warp_max(value):
    """Max over the 32 lanes of a warp."""
    offset = 16
    while offset > 0:
        value = max(value, cuda.shfl_xor_sync(FULL_MASK, value, offset))
        offset //= 2
    return value


@device_function
def lanes_sum(value, lanes):
    """Sum over each aligned group of `lanes` lanes (a power of two, at most 32): the
    butterfly's first steps only. Every lane of the warp must call it."""
    offset = lanes // 2
    while offset > 0:
        value += cuda.shfl_xor_sync(FULL_MASK, value, offset)
        offset //= 2
    return value


@device_function
def lanes_max(value, lanes):
    """Max over each aligned group of `lanes` lanes (as lanes_sum)."""
    offset = lanes // 2
    while offset > 0:
        value = max(value, cuda.shfl_xor_sync(FULL_MASK, value, offset))
        offset //= 2
    return value
