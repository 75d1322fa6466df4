"""Packed weights laid out 16 rows to a group at load, for the byte-dot kernels: the
form every packed matrix is multiplied in on the CPU.

A PackedWeight (formats/packed.py) keeps each row's bytes together. vpdpbusd (and
AVX2's vpmaddubsw, byte_dot.py) wants them the other way: one 64-byte vector holding
4 bytes of each of 16 rows, so that one instruction takes 16 rows' 4-column dot
products with no sum across lanes (a row-major kernel pays a horizontal sum for
every block of every row: bench/NOTES.md). Laid out once at load:
    quants  (G, C, 16, 4): group g, 4-byte chunk c of a row, row j, byte t; the
            PackedWeight's bytes (Q8_0: int8 q, C = K/4; Q4_x: nibble bytes,
            C = K/8, chunk c holding columns 4c .. 4c + 3 low and K/2 + 4c .. high)
    scales  (G, K/32, 16) float16 bits: block b of row j at [g, b, j]; Q4_K and Q5_K:
            the 6-bit sc (uint8)
    mins    (G, K/32, 16) float16 bits (Q4_1, Q5_1); Q4_K and Q5_K: the 6-bit m
    supers  (G, K/128, 16) float16 bits, Q4_K and Q5_K: super-block s's d at [g, 2s, j],
            its dmin at [g, 2s + 1, j]; Q6_K (G, K/256, 16): its d
    Q6_K:   quants as Q4_x (q's low 4 bits), scales (G, K/16, 16) int8 sub-scales
    fifths  the high bits (Q5_x's and Q5_K's fifth, Q6_K's bits 4 and 5) in bytes laid
            as a chunk's: (G, K/32, 64) for Q5, (G, K/16, 64) for Q6_K, where byte
            4j + t of v holds row j's high bits of column 4(S v + s) + t at bit s (Q5,
            S = 8) or bits 2s, 2s + 1 (Q6_K, S = 4). A shift and an and put a chunk's
            in place (AVX-512 VNNI: 12-35% faster than a 64-bit mask a chunk moved in
            by a masked select; AVX2 has no such move: bench/NOTES.md).
G = ceil(N / 16); the last group's missing rows are zeros (their outputs dropped).
The bytes held are the PackedWeight's, give or take those rows.

lane_packed.LanePacked holds a laid-out matrix; its products (lanes_product.py) give
every row the same bits whatever the batch (LANES.md: the float steps, blocks in
order); the tests hold them to an oracle.
Every CPU and every packed kind: the byte dot is AVX-512 VNNI's, AVX2's, or plain
LLVM vectors (byte_dot.LANES_ISA).
"""
from __future__ import annotations

import numpy as np
from numba import prange

from ...formats.packed import PackedWeight
from ...formats.quant_kind import QuantKind
from ...jit_cache import cached_njit
from .vector_ir import LANES


def _grouped(a: np.ndarray, inner: int = 1) -> np.ndarray:
    """(N, X) -> (G, X / inner, 16, inner): row j of group g at [g, :, j], zero rows
    after N."""
    groups = -(-len(a) // LANES)
    padded = np.zeros((groups * LANES, a.shape[1]), a.dtype)
    padded[:len(a)] = a
    return np.ascontiguousarray(
        padded.reshape(groups, LANES, a.shape[1] // inner, inner).transpose(0, 2, 1, 3))


def _grouped_in_place(a: np.ndarray, inner: int) -> np.ndarray | None:
    """_grouped(a, inner) in a's own memory (a group's 16 rows are contiguous already:
    only its bytes move), or None where a cannot be written over (rows not a multiple
    of 16, a view, read-only). a is lost. The copy would hold the matrix twice at load:
    +178 MB for Gemma 3's lm_head."""
    n, width = a.shape
    if n % LANES or not (a.flags.c_contiguous and a.flags.owndata and a.flags.writeable):
        return None
    by_group = a.reshape(n // LANES, LANES * width)
    chunk = np.dtype(f"u{inner * a.itemsize}")  # a chunk of inner values as one element
    _regroup(by_group.view(chunk), width // inner)
    return by_group.reshape(n // LANES, width // inner, LANES, inner)


@cached_njit(parallel=True)
def _regroup(groups, chunks):
    """Each group (16 rows of `chunks` elements, one after the other) rewritten in
    place with chunk c of row j at c * 16 + j."""
    for g in prange(groups.shape[0]):
        rows = groups[g].copy()
        out = groups[g]
        for j in range(LANES):
            for c in range(chunks):
                out[c * LANES + j] = rows[j * chunks + c]


def _high_bit_bytes(weight: PackedWeight) -> np.ndarray:
    """A packed weight's high bits in bytes (the module's docstring: fifths)."""
    n, k = weight.shape
    planes = weight.kind.high_bits
    out = np.zeros((-(-n // LANES), k // (32 // planes), 4 * LANES), np.uint8)
    _fill_high_bit_bytes(weight.highs, n, k, planes, out)
    return out


@cached_njit(parallel=True)
def _fill_high_bit_bytes(highs, n, k, planes, out):
    per_byte = 8 // planes  # chunks whose bits a byte holds
    for g in prange(out.shape[0]):
        for j in range(min(LANES, n - g * LANES)):
            row = highs[g * LANES + j]
            for c in range(k):
                v, s, t = c // (4 * per_byte), (c // 4) % per_byte, c % 4
                for p in range(planes):
                    # Q6_K: per 32 columns, 4 bytes of bit 4, then 4 of bit 5
                    byte = row[8 * (c // 32) + 4 * p + (c % 32) // 8] if planes == 2 else row[c // 8]
                    out[g, v, 4 * j + t] |= np.uint8(((byte >> (c % 8)) & 1) << (planes * s + p))


def lay_out(weight: PackedWeight, in_place: bool = False) -> dict:
    """A packed weight's arrays laid out (the docstring's quants, scales, mins, supers,
    fifths; None for those its kind lacks). in_place: the quants in their own memory
    where they allow it (weight is then lost)."""
    quants = _grouped_in_place(weight.quants, 4) if in_place else None
    supers = None
    if weight.supers is not None:  # (N, K/256, 2) -> (G, K/128, 16)
        supers = _grouped(weight.supers.reshape(len(weight.supers), -1))[..., 0].copy()
    return {"quants": _grouped(weight.quants, 4) if quants is None else quants,
            "scales": _grouped(weight.scales)[..., 0].copy(),
            "mins": None if weight.mins is None else _grouped(weight.mins)[..., 0].copy(),
            "supers": supers,
            "fifths": None if weight.highs is None else _high_bit_bytes(weight)}


def packed_rows(kind: QuantKind, shape: tuple[int, int], laid: dict, rows) -> PackedWeight:
    """Rows (an index array) of a laid-out matrix (lay_out's arrays) as a PackedWeight."""
    rows = np.asarray(rows)
    g, j = rows // LANES, rows % LANES
    quants, fifths = laid["quants"][g, :, j, :].reshape(len(rows), -1), laid["fifths"]
    highs = None
    if fifths is not None:
        planes = _rows_of_bit_bytes(fifths, kind.high_bits, g, j)
        if kind.high_bits == 2:  # Q6_K, per block: bit 4's 4 bytes, then bit 5's
            highs = np.stack([np.packbits(p.reshape(len(rows), -1, 32), axis=2, bitorder="little")
                              for p in planes], axis=2).reshape(len(rows), -1)
        else:
            highs = np.packbits(planes[0], axis=1, bitorder="little")
    supers, mins = laid["supers"], laid["mins"]
    return PackedWeight(kind, (len(rows), shape[1]), quants, laid["scales"][g, :, j],
                        None if mins is None else mins[g, :, j],
                        None if supers is None else supers[g, :, j].reshape(len(rows), shape[1] // 256, -1),
                        highs)


def _rows_of_bit_bytes(fifths: np.ndarray, planes: int, g: np.ndarray, j: np.ndarray) -> list[np.ndarray]:
    """High bits kept in bytes (fifths) -> each plane's bits of rows (g, j), (r,
    K) in column order. Only the rows' own bytes are read."""
    quads = fifths[g].reshape(len(g), -1, LANES, 4)[np.arange(len(g)), :, j, :]  # (r, v, t)
    shifts = planes * np.arange(8 // planes, dtype=np.uint8)[None, None, :, None]  # (s)
    return [((quads[:, :, None, :] >> (shifts + p)) & 1).reshape(len(g), -1) for p in range(planes)]
