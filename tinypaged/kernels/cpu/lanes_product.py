"""Products with laid-out weights (lanes.py), bit for bit the PackedWeight kernels'
(quantized.py, packed_gemm.py) for every row, whatever the batch.

Decode (M <= GEMV_MAX_ROWS rows of x): threads take groups of 16 rows and run
lanes_ir.group_gemv on each, one row of x at a time.
More rows: the group GEMM's blocks (group_ir.accumulate_block_vnni, _q6 for Q6_K)
on each group's bytes made unsigned once per call (Q8_0: xor 128; the 4-bit kinds:
the nibbles split into their own bytes, the high bits added: the layout
packed_gemm's groups take), 16 x K bytes in L1, then reused by every 8 rows of x.
No transposes per call; the next group's bytes are prefetched.
"""
import numpy as np
from numba import float32, njit, prange, types
from numba.extending import overload

from .activations import quantize_activations
from .out_arrays import output_array
from .common import N_CHUNKS, f16_bits_to_f32
from .group_ir import BLOCK, X_ROWS, accumulate_block_vnni, accumulate_block_vnni_q6
from .lanes import LANES
from .lanes_ir import group_gemv, prefetch, store_lanes, unsigned_group
from .packed_gemm import _lows
from .packed_terms import dot_offset, flat_bits as _flat  # (an array flat, or None)
from .packed_terms import is_q6_k

GEMV_MAX_ROWS = 2  # as quantized.py


def _per_group(array):
    """Elements of a laid-out array a group holds (array[0].size), 0 for None."""
    raise NotImplementedError("numba-only: see the overload below")


@overload(_per_group, inline="always")
def _per_group_or_none(array):
    if isinstance(array, types.NoneType):
        return lambda array: 0
    return lambda array: array[0].size


def _x_sums(scales, xq, qsum):
    """What the kernels read as x's block sums: qsum (M, K/32), or for Q6_K its sums of
    16 values (M, K/16)."""
    raise NotImplementedError("numba-only: see the overload below")


@overload(_x_sums, inline="always")
def _x_sums_by_kind(scales, xq, qsum):
    if not is_q6_k(scales):
        return lambda scales, xq, qsum: qsum

    def halves(scales, xq, qsum):
        sums = np.zeros((xq.shape[0], xq.shape[1] // 16), dtype=np.int32)
        for m in range(xq.shape[0]):
            for i in range(xq.shape[1]):
                sums[m, i >> 4] += np.int32(xq[m, i])
        return sums
    return halves


@njit(parallel=True, cache=True)
def _gemv_lanes(x, quants, scales, mins, supers, fifths, out):
    """out (M, N) = round_activations(x) (M, K) @ W.T, small M; W laid out (lanes.py).
    Threads take groups of 16 rows, spread evenly over N_CHUNKS ranges."""
    xq, dx, qsum = quantize_activations(x)
    n_rows, width = x.shape
    n_out = out.shape[1]
    n_groups, group_bytes = quants.shape[0], quants.shape[1] * LANES * 4
    n_blocks = width // BLOCK
    q_flat, x_flat, s_flat, m_flat = quants.reshape(-1), xq.reshape(-1), scales.reshape(-1), _flat(mins)
    f_flat, u_flat = _flat(fifths), _flat(supers)
    dx_flat, sums_flat = dx.reshape(-1), _x_sums(scales, xq, qsum).reshape(-1)
    for c in prange(N_CHUNKS):
        acc = np.empty(LANES, dtype=np.float32)
        for g in range(c * n_groups // N_CHUNKS, (c + 1) * n_groups // N_CHUNKS):
            for m in range(n_rows):
                group_gemv(q_flat, g * group_bytes, x_flat, m * width, n_blocks, s_flat, m_flat,
                           g * _per_group(scales), u_flat, g * _per_group(supers), f_flat,
                           g * _per_group(fifths), dx_flat, sums_flat, m * n_blocks, acc)
                for j in range(min(LANES, n_out - g * LANES)):
                    out[m, g * LANES + j] = acc[j]


def _group_scales(scales, mins, supers, g, scale, low):
    """scale[b, j], low[b, j]: group g's block scales and mins in float32, as
    packed_terms' scale_of and min_of compute them (low untouched without mins)."""
    raise NotImplementedError("numba-only: see the overload below")


@overload(_group_scales, inline="always")
def _group_scales_by_kind(scales, mins, supers, g, scale, low):
    if is_q6_k(scales):  # d alone (the sub-scales are in the block's dot)
        def q6_k(scales, mins, supers, g, scale, low):
            for b in range(scale.shape[0]):
                for j in range(LANES):
                    scale[b, j] = f16_bits_to_f32(supers[g, b >> 3, j])
        return q6_k
    if not isinstance(supers, types.NoneType):  # Q4_K, Q5_K: d * sc and -(dmin * m)
        def k_quant(scales, mins, supers, g, scale, low):
            for b in range(scale.shape[0]):
                for j in range(LANES):
                    scale[b, j] = f16_bits_to_f32(supers[g, 2 * (b >> 3), j]) * float32(scales[g, b, j])
                    low[b, j] = -(f16_bits_to_f32(supers[g, 2 * (b >> 3) + 1, j]) * float32(mins[g, b, j]))
        return k_quant

    def widen(scales, mins, supers, g, scale, low):
        _widen_group(scales, g, scale)
        _widen_group(mins, g, low)
    return widen


def _widen_group(bits, g, values):
    """values[b, j] = bits[g, b, j] (float16 bits) in float32; nothing for bits None."""
    raise NotImplementedError("numba-only: see the overload below")


@overload(_widen_group, inline="always")
def _widen_group_or_none(bits, g, values):
    if isinstance(bits, types.NoneType):
        return lambda bits, g, values: None

    def widen(bits, g, values):
        source, target = bits[g].reshape(-1), values.reshape(-1)
        for i in range(target.size):
            target[i] = f16_bits_to_f32(source[i])
    return widen


def _accumulate(group, b, xq, scale, low, dx, qsum, halves, subs, m0, acc, offset, scales, g):
    """Block b's products for 8 rows of x (group_ir.py); Q6_K's with the group's
    sub-scales (subs, filled from scales[g] at its first block)."""
    raise NotImplementedError("numba-only: see the overload below")


@overload(_accumulate, inline="always")
def _accumulate_by_kind(group, b, xq, scale, low, dx, qsum, halves, subs, m0, acc, offset, scales, g):
    if is_q6_k(scales):
        def q6_k(group, b, xq, scale, low, dx, qsum, halves, subs, m0, acc, offset, scales, g):
            if b == 0 and m0 == 0:
                for h in range(subs.shape[0]):
                    for j in range(LANES):
                        subs[h, j] = np.int32(scales[g, h, j])
            accumulate_block_vnni_q6(group, b * BLOCK * LANES, xq, b * BLOCK, scale, None, b, dx,
                                     halves, m0, acc, subs)
        return q6_k

    def other(group, b, xq, scale, low, dx, qsum, halves, subs, m0, acc, offset, scales, g):
        accumulate_block_vnni(group, b * BLOCK * LANES, xq, b * BLOCK, scale, low, b, dx, qsum, m0,
                              acc, offset)
    return other


@njit(parallel=True, cache=True)
def _gemm_lanes(xq, dx, qsum, halves, quants, scales, mins, supers, fifths, out):
    """out (M, N) for laid-out W; xq (M8, K) x's int8 values, M8 = M rounded up to a
    multiple of 8 (zero rows after M); dx, qsum (M8, K/32); halves (M8, K/16), x's sums
    of 16 values (Q6_K; else unread). As packed_gemm._gemm, with each group's bytes
    only made unsigned, not transposed."""
    n_out = out.shape[1]
    padded_rows, width = xq.shape
    n_blocks = width // BLOCK
    n_groups, group_bytes = quants.shape[0], quants.shape[1] * LANES * 4
    q_flat, f_flat, fifth_bytes = quants.reshape(-1), _flat(fifths), _per_group(fifths)
    out_flat = out.reshape(-1)
    offset = dot_offset(quants, scales, mins, fifths)
    for c in prange(N_CHUNKS):
        group = np.empty(width * LANES, dtype=np.uint8)
        scale = np.empty((n_blocks, LANES), dtype=np.float32)
        low = np.empty((n_blocks, LANES), dtype=np.float32)
        acc = np.empty(X_ROWS * LANES, dtype=np.float32)
        subs = np.empty((2 * n_blocks, LANES), dtype=np.int32)  # Q6_K's sub-scales
        last = (c + 1) * n_groups // N_CHUNKS - 1
        for g in range(c * n_groups // N_CHUNKS, last + 1):
            unsigned_group(q_flat, g * group_bytes, f_flat, g * fifth_bytes, group, scales)
            if g < last:  # the next group's bytes arrive while this one is multiplied
                prefetch(q_flat, (g + 1) * group_bytes, (g + 2) * group_bytes)
            _group_scales(scales, mins, supers, g, scale, low)
            rows = min(LANES, n_out - g * LANES)
            for m0 in range(0, padded_rows, X_ROWS):
                acc[:] = 0.0
                for b in range(n_blocks):
                    _accumulate(group, b, xq, scale, _lows(mins, low), dx, qsum, halves, subs, m0,
                                acc, offset, scales, g)
                for i in range(min(X_ROWS, out.shape[0] - m0)):
                    if rows == LANES:
                        store_lanes(acc, i * LANES, out_flat, (m0 + i) * n_out + g * LANES)
                    else:
                        for j in range(rows):
                            out[m0 + i, g * LANES + j] = acc[i * LANES + j]


def lanes_product(x: np.ndarray, weight) -> np.ndarray:
    """round_activations(x) (M, K) @ W.T for a LanePacked W -> (M, N)."""
    out = output_array(len(x), weight.shape[0])
    if len(x) <= GEMV_MAX_ROWS:
        _gemv_lanes(x, weight.quants, weight.scales, weight.mins, weight.supers, weight.fifths, out)
    else:
        xq, dx, qsum = quantize_activations(x, -(-len(x) // X_ROWS) * X_ROWS)
        halves = xq.reshape(len(xq), -1, 16).sum(axis=2, dtype=np.int32) \
            if weight.scales.dtype == np.int8 else qsum  # (Q6_K: sums of 16 values of x)
        _gemm_lanes(xq, dx, qsum, halves, weight.quants, weight.scales, weight.mins, weight.supers,
                    weight.fifths, out)
    return out
