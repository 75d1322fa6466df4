"""The CPU's packed products: x rounded to int8 blocks (activations.py) times a
laid-out weight (lanes.py), the same bits for a row whatever the batch (LANES.md).
The weight's kind is each kernel's first argument (kind_arg.py): one machine code
per kind, which checks that the arrays it is handed are that kind's.

Threads take groups of 16 rows. Decode (M <= PACKED_GEMV_MAX_ROWS rows of x):
lanes_ir.group_gemv on each, one row of x at a time. More rows: lanes_ir.group_gemm_wide,
16 rows of x a pass (group_gemm for 8 left over), each chunk of the group's bytes
made unsigned in registers and taken by the 16 rows' vpdpbusd (AVX2: vpmaddubsw,
byte_dot.py); the group stays in L1 for the next pass, the next group's bytes are
prefetched. On AVX2 the 4-bit kinds take each half of a group apart, 12 rows of x a
pass (_gemm_lanes_by_halves). x's rows of a pass are laid side by side per call (M x K
bytes: rows K apart, K a power of two from 4,096, fall in one L1 set and evict each
other); nothing else is copied or transposed per call.
"""
import numpy as np
from numba import prange, types
from numba.extending import overload

from ...formats.quant_kind import QK, Q6_K
from ...jit_cache import cached_njit
from .activations import quantize_activations
from .byte_dot import LANES_ISA
from .common import N_CHUNKS, PACKED_GEMV_CHUNKS, PACKED_GEMV_MAX_ROWS
from .kind_arg import QuantKindType, kind_arg
from .lanes_ir import (HALF_ROWS, WIDE_ROWS, group_gemm, group_gemm_wide, group_gemv, group_half_gemm,
                       group_half_gemm_8, prefetch, store_lanes)
from .out_arrays import output_array
from .vector_ir import LANES, X_ROWS

HALF = LANES // 2  # a group's rows in one AVX2 register


def _per_group(array):
    """Elements of a laid-out array a group holds (array[0].size), 0 for None."""
    raise NotImplementedError("numba-only: see the overload below")


@overload(_per_group, inline="always")
def _per_group_or_none(array):
    if isinstance(array, types.NoneType):
        return lambda array: 0
    return lambda array: array[0].size


def _flat(array):
    """array flat, or None for None (a kind without those arrays)."""
    raise NotImplementedError("numba-only: see the overload below")


@overload(_flat, inline="always")
def _flat_or_none(array):
    if isinstance(array, types.NoneType):
        return lambda array: None
    return lambda array: array.reshape(-1)


def _x_sums(kind, xq, qsum):
    """What the kernels read as x's block sums: qsum (M, K/32) as float32 for the kinds
    with mins (exact: |qsum| <= 32 * 127; their kernel only multiplies it by the min),
    qsum itself for the kinds whose dot subtracts an offset times it, or for Q6_K 32
    times its sums of 16 values (M, K/16): the 32 its q carry above q - 32."""
    raise NotImplementedError("numba-only: see the overload below")


@overload(_x_sums, inline="always")
def _x_sums_by_kind(kind, xq, qsum):
    if not isinstance(kind, QuantKindType):
        return None
    if kind.kind.has_mins:
        return lambda kind, xq, qsum: qsum.astype(np.float32)
    if kind.code != Q6_K:
        return lambda kind, xq, qsum: qsum

    def halves(kind, xq, qsum):
        sums = np.zeros((xq.shape[0], xq.shape[1] // 16), dtype=np.int32)
        for m in range(xq.shape[0]):
            for i in range(xq.shape[1]):
                sums[m, i >> 4] += np.int32(32) * np.int32(xq[m, i])
        return sums
    return halves


@cached_njit(parallel=True)
def _gemv_lanes(kind, x, quants, scales, mins, supers, fifths, out):
    """out (M, N) = round_activations(x) (M, K) @ W.T, small M; W laid out (lanes.py),
    of the kind `kind` (kind_arg.py).
    Threads take groups of 16 rows, spread evenly over PACKED_GEMV_CHUNKS ranges."""
    xq, dx, qsum = quantize_activations(x, len(x))
    n_rows, width = x.shape
    n_out = out.shape[1]
    n_groups, group_bytes = quants.shape[0], quants.shape[1] * LANES * 4
    n_blocks = width // QK
    q_flat, x_flat, s_flat, m_flat = quants.reshape(-1), xq.reshape(-1), scales.reshape(-1), _flat(mins)
    f_flat, u_flat = _flat(fifths), _flat(supers)
    dx_flat, sums_flat = dx.reshape(-1), _x_sums(kind, xq, qsum).reshape(-1)
    for c in prange(PACKED_GEMV_CHUNKS):
        acc = np.empty(LANES, dtype=np.float32)
        for g in range(c * n_groups // PACKED_GEMV_CHUNKS, (c + 1) * n_groups // PACKED_GEMV_CHUNKS):
            for m in range(n_rows):
                group_gemv(kind, q_flat, g * group_bytes, x_flat, m * width, n_blocks, s_flat, m_flat,
                           g * _per_group(scales), u_flat, g * _per_group(supers), f_flat,
                           g * _per_group(fifths), dx_flat, sums_flat, m * n_blocks, acc)
                for j in range(min(LANES, n_out - g * LANES)):
                    out[m, g * LANES + j] = acc[j]


@cached_njit(parallel=True)
def _gemm_lanes(kind, xq, dx, qsum, quants, scales, mins, supers, fifths, out):
    """out (M, N) for laid-out W; xq (M8, K) x's int8 values, M8 = M rounded up to a
    multiple of 8 (zero rows after M); dx, qsum (M8, K/32) its scales and sums.
    Threads take groups of 16 rows; each group is multiplied by 16 rows of x at a
    time (then 8, where M8 leaves 8 over) while its bytes are in L1 (made unsigned in
    registers, chunk by chunk, each pass), the next group's prefetched. x's rows of a
    pass lie side by side (interleave_rows): a chunk's x is one cache line."""
    n_out = out.shape[1]
    padded_rows, width = xq.shape
    wide_end = padded_rows - padded_rows % WIDE_ROWS  # rows taken 16 at a time; 8 after
    n_blocks = width // QK
    n_groups, group_bytes = quants.shape[0], quants.shape[1] * LANES * 4
    q_flat, s_flat, m_flat = quants.reshape(-1), scales.reshape(-1), _flat(mins)
    f_flat, u_flat, out_flat = _flat(fifths), _flat(supers), out.reshape(-1)
    x_flat, dx_flat, sums_flat = _interleaved(kind, xq, dx, qsum, WIDE_ROWS)
    for c in prange(N_CHUNKS):
        acc = np.empty(WIDE_ROWS * LANES, dtype=np.float32)
        last = (c + 1) * n_groups // N_CHUNKS - 1
        for g in range(c * n_groups // N_CHUNKS, last + 1):
            if g < last:  # the next group's bytes arrive while this one is multiplied
                prefetch(q_flat, (g + 1) * group_bytes, (g + 2) * group_bytes)
            rows = min(LANES, n_out - g * LANES)
            m0 = 0
            while m0 < padded_rows:
                if m0 < wide_end:
                    group_gemm_wide(kind, q_flat, g * group_bytes, x_flat, m0 * width, n_blocks, s_flat,
                                    m_flat, g * _per_group(scales), u_flat, g * _per_group(supers),
                                    f_flat, g * _per_group(fifths), dx_flat, sums_flat,
                                    m0 * n_blocks, acc)
                    tile = WIDE_ROWS
                else:
                    group_gemm(kind, q_flat, g * group_bytes, x_flat, m0 * width, n_blocks, s_flat, m_flat,
                               g * _per_group(scales), u_flat, g * _per_group(supers), f_flat,
                               g * _per_group(fifths), dx_flat, sums_flat, m0 * n_blocks, acc)
                    tile = X_ROWS
                for i in range(min(tile, out.shape[0] - m0)):
                    if rows == LANES:
                        store_lanes(acc, i * LANES, out_flat, (m0 + i) * n_out + g * LANES)
                    else:
                        for j in range(rows):
                            out[m0 + i, g * LANES + j] = acc[i * LANES + j]
                m0 += tile


@cached_njit()
def _pass_rows(left, widest):
    """Rows of x the next pass takes, `left` (a multiple of 8) still to go: for
    _gemm_lanes (widest WIDE_ROWS) 16, or 8 where fewer are left; for
    _gemm_lanes_by_halves (widest HALF_ROWS) 12, or 8 where 8 or 16 are left."""
    if widest == WIDE_ROWS:
        return WIDE_ROWS if left >= WIDE_ROWS else X_ROWS
    return X_ROWS if left == X_ROWS or left == 2 * X_ROWS else HALF_ROWS


@cached_njit()
def interleave_rows(a, unit, widest):
    """a (M8, L) flat, pass by pass (_pass_rows), each pass's rows side by side, `unit`
    values at a time: the pass of `tile` rows from m0 holds a[m0 + i, unit v + e] at
    m0 L + unit (tile v + i) + e. So a pass's reads of a chunk are one line, at one base
    plus immediates (lanes_ir._group_product). On this thread: a few parallel launches
    a product cost SmolLM2's 32-row step more than the copy (M x L bytes) does."""
    rows, length = a.shape
    out = np.empty(rows * length, a.dtype)
    m0 = 0
    while m0 < rows:
        tile = _pass_rows(rows - m0, widest)
        for v in range(length // unit):
            for i in range(tile):
                for e in range(unit):
                    out[m0 * length + unit * (tile * v + i) + e] = a[m0 + i, unit * v + e]
        m0 += tile
    return out


@cached_njit()
def _interleaved(kind, xq, dx, qsum, widest):
    """x's values, scales and sums as the GEMM's passes read them (interleave_rows), flat."""
    n_blocks = xq.shape[1] // QK
    sums = _x_sums(kind, xq, qsum)
    return (interleave_rows(xq.view(np.int32), 1, widest).view(np.int8),  # (4 bytes at a time)
            interleave_rows(dx, 1, widest), interleave_rows(sums, sums.shape[1] // n_blocks, widest))


@cached_njit(parallel=True)
def _gemm_lanes_by_halves(kind, xq, dx, qsum, quants, scales, mins, supers, fifths, out):
    """_gemm_lanes for AVX2 and the 4-bit kinds: a group's halves (8 rows) apart,
    HALF_ROWS rows of x a pass (8 where 8 or 16 are left), so that a pass's sums stay
    in registers (lanes_ir.HALF_ROWS)."""
    n_out = out.shape[1]
    padded_rows, width = xq.shape
    n_blocks = width // QK
    n_groups, group_bytes = quants.shape[0], quants.shape[1] * LANES * 4
    q_flat, s_flat, m_flat = quants.reshape(-1), scales.reshape(-1), _flat(mins)
    f_flat, u_flat = _flat(fifths), _flat(supers)
    x_flat, dx_flat, sums_flat = _interleaved(kind, xq, dx, qsum, HALF_ROWS)
    for c in prange(N_CHUNKS):
        acc = np.empty(HALF_ROWS * HALF, dtype=np.float32)
        last = (c + 1) * n_groups // N_CHUNKS - 1
        for g in range(c * n_groups // N_CHUNKS, last + 1):
            if g < last:  # the next group's bytes arrive while this one is multiplied
                prefetch(q_flat, (g + 1) * group_bytes, (g + 2) * group_bytes)
            for h in range(2):
                lane0 = g * LANES + h * HALF
                rows = min(HALF, n_out - lane0)
                q_at, f_at = g * group_bytes + 4 * HALF * h, g * _per_group(fifths) + 4 * HALF * h
                s_at, u_at = g * _per_group(scales) + HALF * h, g * _per_group(supers) + HALF * h
                m0 = 0
                while m0 < padded_rows and rows > 0:
                    if _pass_rows(padded_rows - m0, HALF_ROWS) == X_ROWS:
                        group_half_gemm_8(kind, q_flat, q_at, x_flat, m0 * width, n_blocks, s_flat, m_flat,
                                          s_at, u_flat, u_at, f_flat, f_at, dx_flat, sums_flat,
                                          m0 * n_blocks, acc)
                        tile = X_ROWS
                    else:
                        group_half_gemm(kind, q_flat, q_at, x_flat, m0 * width, n_blocks, s_flat, m_flat,
                                        s_at, u_flat, u_at, f_flat, f_at, dx_flat, sums_flat,
                                        m0 * n_blocks, acc)
                        tile = HALF_ROWS
                    for i in range(min(tile, out.shape[0] - m0)):
                        for j in range(rows):
                            out[m0 + i, lane0 + j] = acc[i * HALF + j]
                    m0 += tile


def lanes_product(x: np.ndarray, weight) -> np.ndarray:
    """round_activations(x) (M, K) @ W.T for a LanePacked W -> (M, N)."""
    out = output_array(len(x), weight.shape[0])
    kind, arrays = kind_arg(weight.kind), (weight.quants, weight.scales, weight.mins, weight.supers,
                                           weight.fifths)
    if len(x) <= PACKED_GEMV_MAX_ROWS:
        _gemv_lanes(kind, x, *arrays, out)
    else:
        xq, dx, qsum = quantize_activations(x, -(-len(x) // X_ROWS) * X_ROWS)
        # (AVX2: the 4-bit kinds take a group's halves apart: lanes_ir.HALF_ROWS)
        gemm = _gemm_lanes_by_halves if LANES_ISA == "avx2" and weight.kind.bits == 4 else _gemm_lanes
        gemm(kind, xq, dx, qsum, *arrays, out)
    return out
