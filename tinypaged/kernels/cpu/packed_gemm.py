"""The product with a packed weight for more than a few rows of x (batched decode,
prefill): bit for bit the decode GEMV's result (packed_terms.py), at the speed of a
float GEMM or better.

Each thread takes W's rows 16 at a time (a group): it lays the group out once per
call, then for 8 rows of x at a time and block after block computes the 16 x 8
exact integer dot products in vector lanes and scales them as block_term does
(group_ir.py). With AVX-512 VNNI the group stays in bytes and vpdpbusd does 64
multiply-adds an instruction; elsewhere it is widened to float32 and fused
multiply-adds do 16. Both give the same bits (the tests run both where they can).

Measured (2 cores, AVX-512 VNNI; SmolLM2's layer shapes, bench/NOTES.md): at 32
rows of x, as fast as the float GEMM of gemm.py on widened weights; at 128 rows,
as BLAS.
"""
import numpy as np
from numba import njit, prange, types
from numba.extending import overload

from ...jit_cache import cached_njit
from .activations import quantize_activations
from .common import HAS_VNNI, N_CHUNKS
from .group_ir import (BLOCK, LANES, X_ROWS, accumulate_block_float, accumulate_block_vnni,
                       accumulate_block_vnni_q6)
from .group_layout import widen_chunk_bytes, widen_chunk_float
from .packed_terms import dot_offset, is_q6_k, min_of, nibble_offset, scale_of


def _lows(mins, low):
    """low (the group's mins), or None for the kinds without mins."""
    raise NotImplementedError("numba-only: see the overload below")


@overload(_lows, inline="always")
def _lows_by_kind(mins, low):
    if isinstance(mins, types.NoneType):
        return lambda mins, low: None
    return lambda mins, low: low


def _fifths_and_tops(scales, highs):
    """(Q5_x's and Q5_K's fifth bits, Q6_K's top bits): highs in its place, None in the
    other (both None for the kinds without highs)."""
    raise NotImplementedError("numba-only: see the overload below")


@overload(_fifths_and_tops, inline="always")
def _fifths_and_tops_by_kind(scales, highs):
    if is_q6_k(scales):
        return lambda scales, highs: (None, highs)
    return lambda scales, highs: (highs, None)


def _group_subscales(scales, n0, subs):
    """Q6_K: subs[h, j] = row n0 + j's int8 scale of its 16 columns h (other kinds:
    nothing)."""
    raise NotImplementedError("numba-only: see the overload below")


@overload(_group_subscales, inline="always")
def _group_subscales_by_kind(scales, n0, subs):
    if is_q6_k(scales):
        def fill(scales, n0, subs):
            for j in range(LANES):
                for h in range(subs.shape[0]):
                    subs[h, j] = scales[n0 + j, h]
        return fill
    return lambda scales, n0, subs: None


@njit(inline="always")
def _group_scales(scales, mins, supers, n0, scale, low, subs):
    """scale[b, j], low[b, j] = row n0 + j's scale and min (0 without mins) of block b
    (and Q6_K's sub-scales into subs)."""
    for j in range(LANES):
        for b in range(scale.shape[0]):
            scale[b, j] = scale_of(scales, supers, n0 + j, b)
            low[b, j] = min_of(mins, supers, n0 + j, b)
    _group_subscales(scales, n0, subs)


@njit(inline="always")
def _store_rows(acc, out, m0, n0):
    for i in range(min(X_ROWS, out.shape[0] - m0)):
        for j in range(LANES):
            out[m0 + i, n0 + j] = acc[i * LANES + j]


def _x_for(layout, xq):
    """x as the form's blocks take it: int8 for vnni (layout uint8), float32 else."""
    raise NotImplementedError("numba-only: see the overload below")


@overload(_x_for)
def _x_for_by_form(layout, xq):
    if layout.dtype == types.uint8:
        return lambda layout, xq: xq
    return lambda layout, xq: xq.astype(np.float32)


def _lay_out_chunk(group, quants, scales, highs, n0, p0, mins):
    """Columns p0 .. p0 + 15 of the group's 16 rows into group, in the form's layout."""
    raise NotImplementedError("numba-only: see the overload below")


@overload(_lay_out_chunk, inline="always")
def _lay_out_chunk_by_form(group, quants, scales, highs, n0, p0, mins):
    if group.dtype == types.uint8:
        def lay_out(group, quants, scales, highs, n0, p0, mins):
            fifths, tops = _fifths_and_tops(scales, highs)
            widen_chunk_bytes(quants, fifths, tops, n0, p0, group)
    else:
        def lay_out(group, quants, scales, highs, n0, p0, mins):
            fifths, tops = _fifths_and_tops(scales, highs)
            widen_chunk_float(quants, fifths, tops, scales, n0, p0,
                              nibble_offset(scales, mins, highs), group)
    return lay_out


def _accumulate_block(group, at, x, x_at, scale, low, b, dx, qsum, halves, subs, m0, acc, quants,
                      scales, mins, highs):
    """One block's products for 8 rows of x, in the form's way (group_ir.py)."""
    raise NotImplementedError("numba-only: see the overload below")


@overload(_accumulate_block, inline="always")
def _accumulate_block_by_form(group, at, x, x_at, scale, low, b, dx, qsum, halves, subs, m0, acc,
                              quants, scales, mins, highs):
    if group.dtype == types.uint8 and is_q6_k(scales):
        def accumulate(group, at, x, x_at, scale, low, b, dx, qsum, halves, subs, m0, acc, quants,
                       scales, mins, highs):
            accumulate_block_vnni_q6(group, at, x, x_at, scale, None, b, dx, halves, m0, acc, subs)
    elif group.dtype == types.uint8:
        def accumulate(group, at, x, x_at, scale, low, b, dx, qsum, halves, subs, m0, acc, quants,
                       scales, mins, highs):
            accumulate_block_vnni(group, at, x, x_at, scale, low, b, dx, qsum, m0, acc,
                                  dot_offset(quants, scales, mins, highs))
    else:
        def accumulate(group, at, x, x_at, scale, low, b, dx, qsum, halves, subs, m0, acc, quants,
                       scales, mins, highs):
            accumulate_block_float(group, at, x, x_at, scale, low, b, dx, qsum, m0, acc)
    return accumulate


@cached_njit(parallel=True)
def _gemm(xq, dx, qsum, halves, quants, scales, mins, supers, highs, out, layout):
    """out (M, N) for packed W (N >= 16 rows); xq (M8, K) x's int8 values, M8 = M
    rounded up to a multiple of 8 (zero rows after M); dx, qsum (M8, K/32); halves
    (M8, K/16) x's half-block sums (Q6_K's vnni form; else unread). layout, an
    empty array, picks the form at compile time: uint8 vnni, float32 float lanes.
    Groups are spread evenly over the chunks (ceil-sized ranges would leave the last
    chunks, and so one thread, idle when there are fewer groups than chunks). The
    last group is shifted back to end at row N - 1: a few outputs computed twice,
    identically."""
    n_out = out.shape[1]
    padded_rows, width = xq.shape
    n_blocks = width // BLOCK
    n_groups = -(-n_out // LANES)
    x = _x_for(layout, xq)
    for c in prange(N_CHUNKS):
        group = np.empty(width * LANES, dtype=layout.dtype)
        scale = np.empty((n_blocks, LANES), dtype=np.float32)
        low = np.empty((n_blocks, LANES), dtype=np.float32)
        acc = np.empty(X_ROWS * LANES, dtype=np.float32)
        subs = np.empty((2 * n_blocks, LANES), dtype=np.int32)  # Q6_K's sub-scales
        for g in range(c * n_groups // N_CHUNKS, (c + 1) * n_groups // N_CHUNKS):
            n0 = min(g * LANES, n_out - LANES)
            for p0 in range(0, quants.shape[1], LANES):
                _lay_out_chunk(group, quants, scales, highs, n0, p0, mins)
            _group_scales(scales, mins, supers, n0, scale, low, subs)
            for m0 in range(0, padded_rows, X_ROWS):
                acc[:] = 0.0
                for b in range(n_blocks):
                    _accumulate_block(group, b * BLOCK * LANES, x, b * BLOCK, scale,
                                      _lows(mins, low), b, dx, qsum, halves, subs, m0, acc, quants,
                                      scales, mins, highs)
                _store_rows(acc, out, m0, n0)


def gemm_packed(x: np.ndarray, quants, scales, mins, out: np.ndarray, vnni: bool = HAS_VNNI,
                supers=None, highs=None) -> None:
    """out (M, N) = round_activations(x) @ W.T for packed W (N >= 16 rows), bit for bit
    as the decode GEMV computes each row. vnni: the byte kernel (needs AVX-512 VNNI);
    supers: the K-quants' super-block scales; highs: Q5_x's and Q5_K's fifth bits or
    Q6_K's top bits (formats/packed.py)."""
    xq, dx, qsum = quantize_activations(x, -(-len(x) // X_ROWS) * X_ROWS)
    layout = np.empty(0, dtype=np.uint8 if vnni else np.float32)
    halves = xq.reshape(len(xq), -1, 16).sum(axis=2, dtype=np.int32) if scales.dtype == np.int8 \
        else qsum  # (Q6_K: sums of 16 values of x; other kinds do not read them)
    _gemm(xq, dx, qsum, halves, quants, scales, mins, supers, highs, out, layout)
