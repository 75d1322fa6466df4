"""The CPU's packed products: x rounded to int8 blocks (activations.py) times a
laid-out weight (lanes.py), the same bits for a row whatever the batch (LANES.md).
The weight's kind is each kernel's argument (kind_arg.py): one machine code per kind,
which checks that the arrays it is handed are that kind's.

Threads take groups of 16 rows. Decode (M <= PACKED_GEMV_MAX_ROWS rows of x):
lanes_ir.group_product on each, one row of x at a time. More rows: the GEMM, x padded
to a multiple of 4 rows and taken 16 rows a pass (12 where lanes_ir.widest_pass says: on
VNNI; 8 or 4 for what is left: _pass_rows), each chunk of the group's bytes unpacked in
registers once for all the pass's rows (vpdpbusd; AVX2: vpmaddubsw, byte_dot.py); the
group stays in L1 for the next pass, the next group's bytes are prefetched. On AVX2 the
4-bit kinds take each half of a group apart, 12 rows of x a pass. x's rows are rounded and those of a
pass laid side by side per call, the rows in parallel (_gemm_x); nothing else is
copied or transposed per call.

The GEMV's and the GEMM's work items (_gemv_range, _gemm_range) are compiled on their
own and called from the parallel loops at their address (address_call.py): compiled
into a loop, an item's code would go through LLVM three more times (numba's gufunc and
its two wrappers: ~1.5 s of a kind's first compile each).
"""
import numpy as np
from numba import int64, prange, typeof, types
from numba.extending import overload

from ...formats.quant_kind import QK
from ...jit_cache import cached_njit
from .address_call import call_entry, run_at_address
from .activations import quantize_activations, quantize_row
from .cache_hints import hint_parts
from .common import PACKED_GEMV_MAX_ROWS, PACKED_RANGES
from .kind_arg import QuantKindType, kind_arg
from .lanes_ir import (SHORT_ROWS, HALF_ROWS, WIDE_ROWS, by_halves, group_product, store_lanes, widest_pass,
                       x_row_sums)
from .out_arrays import output_array
from .vector_ir import LANES, X_ROWS

_NOTHING = np.zeros(0, np.uint8)  # (no bytes ahead)


def _pass_form(kind):
    """(halves, widest) of a GEMM pass for the kind: 2 where it takes a group's halves
    apart (lanes_ir.by_halves), else 1; the most rows of x it takes (widest_pass)."""
    raise NotImplementedError("numba-only: see the overload below")


@overload(_pass_form, inline="always")
def _pass_form_of(kind):
    if isinstance(kind, QuantKindType):
        form = (2 if by_halves(kind.kind) else 1, widest_pass(kind.kind))
        return lambda kind: form


def _by_group(array):
    """A laid-out array (lanes.py) as (G, its elements a group), None for None (a kind
    without that array)."""
    raise NotImplementedError("numba-only: see the overload below")


@overload(_by_group, inline="always")
def _by_group_or_none(array):
    if isinstance(array, types.NoneType):
        return lambda array: None
    return lambda array: array.reshape(array.shape[0], -1)


def _view(array, g, start):
    """Group g's part of _by_group's array from element `start`; None for None."""
    raise NotImplementedError("numba-only: see the overload below")


@overload(_view, inline="always")
def _view_or_none(array, g, start):
    if isinstance(array, types.NoneType):
        return lambda array, g, start: None
    return lambda array, g, start: array[g, start:]


@cached_njit(inline="always")
def _group_views(w, g, half):
    """The views lanes_ir's products take of W's arrays by group (quants, scales, mins,
    supers, fifths: _by_group's) for group g, from half `half`'s first lane (half 1:
    lane 8; 4 bytes a lane in a chunk of quants or fifths, 1 element in the others)."""
    lanes = half * (LANES // 2)
    return (_view(w[0], g, 4 * lanes), _view(w[1], g, lanes), _view(w[2], g, lanes), _view(w[3], g, lanes),
            _view(w[4], g, 4 * lanes))


@cached_njit(inline="always")
def _by_groups(w):
    """W's laid-out arrays (lanes.py) as _group_views takes them."""
    return _by_group(w[0]), _by_group(w[1]), _by_group(w[2]), _by_group(w[3]), _by_group(w[4])


@cached_njit()
def _gemv_x(kind, x):
    """x (M, K) as the GEMV's items read it: rounded to int8 blocks (values, scales:
    quantize_activations) and each row's sums (x_row_sums)."""
    xq, dx, qsum = quantize_activations(x, len(x))
    first = x_row_sums(kind, xq[0], qsum[0])
    sums = np.empty((len(x), len(first)), first.dtype)
    for m in range(len(x)):  # (a pass of one row, not sums[m] = ...: numba's shape check cost ~3 s cold)
        _side_by_side(x_row_sums(kind, xq[m], qsum[m]), sums.reshape(-1), m * sums.shape[1], 1, 0, 1)
    return xq, dx, sums


@cached_njit(parallel=True)
def _gemv_lanes(kind, x, w, out, entry):
    """out (M, N) = round_activations(x) (M, K) @ W.T, small M; W's laid-out arrays w
    (lanes.py), of the kind `kind` (kind_arg.py): PACKED_RANGES items (_gemv_range, at
    its address entry: address_call.py) on numba's threads. False where entry does not
    take these arguments."""
    xq, dx, sums = _gemv_x(kind, x)
    done = np.empty(PACKED_RANGES, np.bool_)
    for c in prange(PACKED_RANGES):
        done[c] = call_entry(entry, (np.int64(c), kind, xq, dx, sums, w, out))
    return done.all()


@cached_njit()
def _gemv_range(c, kind, xq, dx, sums, w, out):
    """Item c of the GEMV: its share of W's groups of 16 rows, each times every row of x."""
    n_groups, n_blocks, n_out, by_group = w[0].shape[0], xq.shape[1] // QK, out.shape[1], _by_groups(w)
    acc = np.empty(LANES, dtype=np.float32)
    for g in range(c * n_groups // PACKED_RANGES, (c + 1) * n_groups // PACKED_RANGES):
        group = _group_views(by_group, g, 0)
        for m in range(len(xq)):
            group_product(kind, 1, n_blocks, group, (xq[m], dx[m], sums[m]), acc)
            for j in range(min(LANES, n_out - g * LANES)):
                out[m, g * LANES + j] = acc[j]


@cached_njit(parallel=True)
def _gemm_lanes(kind, x_values, x_scales, x_sums, padded_rows, width, w, out, ahead, entry):
    """The GEMM's PACKED_RANGES items (_gemm_range, at its address entry) on numba's
    threads; False where entry does not take these arguments."""
    done = np.empty(PACKED_RANGES, np.bool_)
    for c in prange(PACKED_RANGES):
        done[c] = call_entry(entry, (np.int64(c), kind, x_values, x_scales, x_sums, padded_rows, width, w, out,
                                     ahead))
    return done.all()


@cached_njit()
def _gemm_range(c, kind, x_values, x_scales, x_sums, padded_rows, width, w, out, ahead):
    """Item c of the GEMM: out (M, N) for its share of W's laid-out arrays w; x's
    padded_rows (M rounded up to a multiple of 4, zero rows after M) of `width` values
    as _gemm_x lays them out. Items take groups of 16 rows (AVX2's 4-bit kinds: each
    half apart); each is multiplied by widest_pass's rows of x at a time, 8 or 4 where
    _pass_rows says, while its bytes are in L1 (unpacked in registers, chunk by chunk, each pass), the next group's
    prefetched. ahead (flat uint8): bytes the caller reads next, hinted into the caches
    a share at each pass (memory idles while 32 rows are multiplied: lanes_ir._pass)."""
    n_out, (halves, widest) = out.shape[1], _pass_form(kind)
    lanes = LANES // halves
    n_groups, n_blocks, out_flat = w[0].shape[0], width // QK, out.reshape(-1)
    sums_a_row, by_group = x_sums.size // padded_rows, _by_groups(w)
    acc = np.empty(widest * lanes, dtype=np.float32)
    for g in range(c * n_groups // PACKED_RANGES, (c + 1) * n_groups // PACKED_RANGES):
        for h in range(halves):
            lane0 = g * LANES + h * lanes
            rows = min(lanes, n_out - lane0)
            group = _group_views(by_group, g, h)
            m0 = 0
            while m0 < padded_rows and rows > 0:
                tile = _pass_rows(padded_rows - m0, widest)
                hint_parts(ahead, (g * halves + h) * padded_rows + m0, tile, n_groups * halves * padded_rows)
                x = (x_values[m0 * width:], x_scales[m0 * n_blocks:], x_sums[m0 * sums_a_row:])
                group_product(kind, tile, n_blocks, group, x, acc)
                for i in range(min(tile, out.shape[0] - m0)):
                    if rows == LANES:
                        store_lanes(acc, i * LANES, out_flat, (m0 + i) * n_out + lane0)
                    else:
                        for j in range(rows):
                            out[m0 + i, lane0 + j] = acc[i * lanes + j]
                m0 += tile


@cached_njit()
def _pass_rows(left, widest):
    """Rows of x the next pass takes, `left` (a multiple of 4) still to go: 4 where 4
    are left; else widest WIDE_ROWS: 16, or 8 where fewer are left; widest HALF_ROWS:
    12, or 8 where 8 or 16 are left."""
    if left == SHORT_ROWS:
        return SHORT_ROWS
    if widest == WIDE_ROWS:
        return WIDE_ROWS if left >= WIDE_ROWS else X_ROWS
    return X_ROWS if left == X_ROWS or left == 2 * X_ROWS else HALF_ROWS


@cached_njit(inline="always")
def _pass_of(m, padded_rows, widest):
    """(first row, rows) of the GEMM pass that takes row m of x."""
    m0 = 0
    while True:
        tile = _pass_rows(padded_rows - m0, widest)
        if m < m0 + tile:
            return m0, tile
        m0 += tile


@cached_njit(inline="always")
def _side_by_side(row, out, base, tile, i, unit):
    """Row i of the pass of `tile` rows whose values start at out[base]: its `unit`
    values at a time, each after the pass's rows before it (a chunk's 4 columns of
    every row in one line: rows K apart, K a power of two from 4,096, fell in one L1
    set and evicted each other)."""
    for v in range(len(row) // unit):
        for e in range(unit):
            out[base + unit * (tile * v + i) + e] = row[unit * v + e]


@cached_njit(parallel=True)
def _gemm_x(kind, x, padded_rows):
    """x (M, K) rounded to int8 blocks (activations.py) and laid out as the GEMM's
    passes read it: values (int8), scales and sums (lanes_ir.x_row_sums), each flat,
    pass by pass, a pass's rows side by side; padded_rows (a multiple of 4) rows, zeros
    after M. A row a thread: 32 rows of 2,048 take ~15 us this way, ~70 on one core
    (bench/NOTES.md)."""
    n_rows, width = x.shape
    n_blocks, widest = width // QK, _pass_form(kind)[1]
    zero_row = x_row_sums(kind, np.zeros(width, np.int8), np.zeros(n_blocks, np.int32))  # (its length, type)
    per_block, sums = len(zero_row) // n_blocks, np.empty(padded_rows * len(zero_row), zero_row.dtype)
    values, scales = np.empty(padded_rows * width, np.int8), np.empty(padded_rows * n_blocks, np.float32)
    qs, ds = np.empty((padded_rows, width), np.int8), np.empty((padded_rows, n_blocks), np.float32)
    qsums, flat, words = np.empty(ds.shape, np.int32), np.ascontiguousarray(x).reshape(-1), values.view(np.int32)
    for m in prange(padded_rows):
        q, d, qsum = qs[m], ds[m], qsums[m]
        if m < n_rows:
            quantize_row(flat, m * width, width, q, d, qsum)
        else:  # a padding row: zeros (np.zeros for every row's arrays took ~1/3 of the time)
            q[:], d[:], qsum[:] = 0, 0, 0
        m0, tile = _pass_of(m, padded_rows, widest)
        _side_by_side(q.view(np.int32), words, m0 * width // 4, tile, m - m0, 1)  # (4 bytes at a time)
        _side_by_side(d, scales, m0 * n_blocks, tile, m - m0, 1)
        _side_by_side(x_row_sums(kind, q, qsum), sums, m0 * len(zero_row), tile, m - m0, per_block)
    return values, scales, sums


_ITEM_ENTRIES: dict = {}  # (item kernel, kind code) -> its entry (address_call.py)


def lanes_product(x: np.ndarray, weight, ahead: np.ndarray | None = None) -> np.ndarray:
    """round_activations(x) (M, K) @ W.T for a LanePacked W -> (M, N). ahead: as
    reference.linear's (the GEMM hints it; the GEMV, bound by its own bytes, does not)."""
    out = output_array(len(x), weight.shape[0])
    kind, w = kind_arg(weight.kind), (weight.quants, weight.scales, weight.mins, weight.supers, weight.fifths)
    code = weight.kind.code
    if len(x) <= PACKED_GEMV_MAX_ROWS:  # (its items' arguments are x's rounding: _gemv_x)
        run_at_address(_gemv_lanes, (kind, x, w, out), _gemv_range, _ITEM_ENTRIES, (_gemv_range, code),
                       lambda args: (int64, typeof(kind), *map(typeof, _gemv_x(kind, x)), typeof(w), typeof(out)))
        return out
    padded_rows = -(-len(x) // SHORT_ROWS) * SHORT_ROWS
    values, scales, sums = _gemm_x(kind, x, padded_rows)
    run_at_address(_gemm_lanes, (kind, values, scales, sums, padded_rows, x.shape[1], w, out,
                                 _NOTHING if ahead is None else ahead), _gemm_range, _ITEM_ENTRIES, (_gemm_range, code))
    return out
