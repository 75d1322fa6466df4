"""LoRA's low-rank terms on the CPU (reference.add_lora is the spec): per batch row,
t = x A^T * scale (r values), then y += t B^T, reading the row's slot's A and B^T
(float32, or float16 widened as read). The products that share an input (q, k, v;
gate, up) go in one call: a call's fixed cost was a third of the terms' (bench/lora.py).
The call reads their stacks from one buffer, a row per slot (model.lora_slots), so it
takes five arrays for them all, not four per product.

Rows of one slot go four at a time (a slot's last four padded with stand-ins that
read its first row and whose sums are dropped), the fours spread over the threads:
each value of A and B^T read serves four rows. The expand sums 16 outputs at a time
over all the ranks in registers (lora_ir.expand_lanes), then adds them to y (ranks
padded to a multiple of four, zero terms past the rank). The terms stream each
adapter's A and B once a step: for four rank-16 adapters on SmolLM2, 78 MB a step in
float32, 39 MB in float16 (bench/lora.py).
Every row, stand-in or not, runs the same instructions in the same order whatever
its neighbours: a batch mixing adapters equals each alone, bit for bit.
"""
import numpy as np
from numba import float32, njit, prange, types
from numba.extending import overload

from ...jit_cache import cached_njit
from .common import f16_bits_to_f32
from .lora_ir import ROWS, expand_lanes
from .views_ir import columns_in
from .vector_ir import LANES


def widened(value):
    """A stack's value as float32: float32 as it is, float16 bits (uint16) widened."""
    raise NotImplementedError("numba-only: see the overload below")


@overload(widened, inline="always")
def _widened_by_type(value):
    if value == types.uint16:
        return lambda value: f16_bits_to_f32(value)  # (vcvtph2ps, vectorized)
    return lambda value: value


@njit(fastmath=True, inline="always")
def _shrink4(x0, x1, x2, x3, a, r4, scale, t):
    """t[q, j] = scale * (x_q . a[j]) for j < r4, four of a's rows a pass (each x
    value read serves four of them, each a value four rows)."""
    for j in range(0, r4, 4):
        a0, a1, a2, a3 = a[j], a[j + 1], a[j + 2], a[j + 3]
        s00 = s01 = s02 = s03 = s10 = s11 = s12 = s13 = float32(0.0)
        s20 = s21 = s22 = s23 = s30 = s31 = s32 = s33 = float32(0.0)
        for i in range(a0.shape[0]):
            w0, w1, w2, w3 = widened(a0[i]), widened(a1[i]), widened(a2[i]), widened(a3[i])
            v0, v1, v2, v3 = x0[i], x1[i], x2[i], x3[i]
            s00 += v0 * w0
            s01 += v0 * w1
            s02 += v0 * w2
            s03 += v0 * w3
            s10 += v1 * w0
            s11 += v1 * w1
            s12 += v1 * w2
            s13 += v1 * w3
            s20 += v2 * w0
            s21 += v2 * w1
            s22 += v2 * w2
            s23 += v2 * w3
            s30 += v3 * w0
            s31 += v3 * w1
            s32 += v3 * w2
            s33 += v3 * w3
        t[0, j], t[0, j + 1], t[0, j + 2], t[0, j + 3] = s00 * scale, s01 * scale, s02 * scale, s03 * scale
        t[1, j], t[1, j + 1], t[1, j + 2], t[1, j + 3] = s10 * scale, s11 * scale, s12 * scale, s13 * scale
        t[2, j], t[2, j + 1], t[2, j + 2], t[2, j + 3] = s20 * scale, s21 * scale, s22 * scale, s23 * scale
        t[3, j], t[3, j + 1], t[3, j + 2], t[3, j + 3] = s30 * scale, s31 * scale, s32 * scale, s33 * scale


@njit(fastmath=True, inline="always")
def _expand4(t, bt, r4, sums, rows, y, column):
    """y[rows[q], column:column + out] += t[q, :r4] @ bt[:r4] for each row that is not a
    stand-in (-1): the sums in `sums` (4, >= out) first, 16 outputs at a time in IR."""
    n_out = bt.shape[1]
    chunks = n_out // LANES
    expand_lanes(t, bt, r4, sums, chunks)
    for q in range(ROWS):  # (what is left past the last 16)
        for o in range(chunks * LANES, n_out):
            acc = float32(0.0)
            for j in range(r4):
                acc += t[q, j] * widened(bt[j, o])
            sums[q, o] = acc
    for q in range(ROWS):
        if rows[q] >= 0:
            y_row, sums_q = y[rows[q], column:column + n_out], sums[q]
            for o in range(n_out):
                y_row[o] += sums_q[o]


@cached_njit(fastmath=True)
def _fours(rows, slots):
    """(n_fours, 4) rows of one slot each (-1: a stand-in) and each four's slot."""
    n = len(rows)
    count, k = 0, 0
    while k < n:
        end = k
        while end < n and end - k < ROWS and slots[end] == slots[k]:
            end += 1
        count += 1
        k = end
    fours = np.full((count, ROWS), -1, np.int32)
    four_slots = np.empty(count, np.int32)
    count, k = 0, 0
    while k < n:
        end = k
        while end < n and end - k < ROWS and slots[end] == slots[k]:
            fours[count, end - k] = rows[end]
            end += 1
        four_slots[count] = slots[k]
        count += 1
        k = end
    return fours, four_slots


@cached_njit(fastmath=True, parallel=True)
def _add_lora(x, products, wholes, buf, layout, ranks, scales, widest, fours, four_slots):
    """Each term m: products[m], which is wholes[m][:, column:column + out] (the
    C-contiguous array it is columns of), gains its terms; its stacks lie in each
    slot's row of buf where layout[m] says (lora_stacks)."""
    columns = columns_in(products, wholes)
    room = 0
    for m in range(len(layout)):  # (not layout[:, 2].max(): under parallel=True, a parallel region of its own)
        room = max(room, layout[m, 2])
    for f in prange(fours.shape[0]):
        t = np.empty((ROWS, room), np.float32)
        sums = np.empty((ROWS, widest), np.float32)
        _add_four(x, wholes, columns, buf, layout, ranks, scales, fours[f], four_slots[f], t, sums)


@njit(fastmath=True)
def _add_four(x, wholes, columns, buf, layout, ranks, scales, rr, s, t, sums):
    """One four's terms (rows rr of slot s; t and sums: its scratch)."""
    first = rr[0]
    x0, x1 = x[first], x[rr[1] if rr[1] >= 0 else first]
    x2, x3 = x[rr[2] if rr[2] >= 0 else first], x[rr[3] if rr[3] >= 0 else first]
    for m in range(len(wholes)):
        r = ranks[m, s]
        if r == 0:
            continue
        a_at, bt_at, room, n_in, n_out = layout[m, 0], layout[m, 1], layout[m, 2], layout[m, 3], layout[m, 4]
        a = buf[s, a_at:a_at + room * n_in].reshape((room, n_in))
        bt = buf[s, bt_at:bt_at + room * n_out].reshape((room, n_out))
        r4 = -(-r // ROWS) * ROWS
        _shrink4(x0, x1, x2, x3, a, r4, scales[m, s], t)
        for j in range(r, r4):  # (the padding's terms: zero)
            t[0, j] = t[1, j] = t[2, j] = t[3, j] = float32(0.0)
        _expand4(t, bt, r4, sums, rr, wholes[m], columns[m])


def lora_groups(rows, slots):
    """The step's adapted rows as add_lora takes them: fours of one slot (_fours)."""
    return _fours(rows, slots)


def upload(x: np.ndarray) -> np.ndarray:
    """A LoRA stack as the kernel reads it: float16 as its bits (widened())."""
    return x.view(np.uint16) if x.dtype == np.float16 else x


def lora_stacks(stacks, region):
    """reference.lora_stacks: (buf, layout, ranks, scales, widest) of the products'
    stacks ((a, bt, ranks, scales) each, as upload() holds them, a and bt views into
    region, slot by slot): buf the region as the stacks' values (slots, values a slot),
    layout (products, 5) each one's (A's start, B^T's start, R, in, out) in a slot's
    row, ranks and scales (products, slots)."""
    a_s, bts, ranks, scales = zip(*stacks)
    item = a_s[0].itemsize
    origin, slot_bytes = region.ctypes.data, region.strides[0]

    def start(part):  # (where part's slot 0 begins in a slot's row, in values)
        at = part.ctypes.data - origin
        assert part.strides[0] == slot_bytes and part[0].flags.c_contiguous and 0 <= at < slot_bytes
        return at // item
    layout = np.array([(start(a), start(bt), a.shape[1], a.shape[2], bt.shape[2]) for a, bt in zip(a_s, bts)],
                      np.int64)
    return (region.view(a_s[0].dtype), layout, np.stack(ranks).astype(np.int32),
            np.stack(scales).astype(np.float32), int(layout[:, 4].max()))


def add_lora(x, ys, stacks, fours, four_slots):
    """reference.add_lora, the rows as lora_groups gives them and the stacks as
    lora_stacks, with a rank dimension that is a multiple of ROWS. Each y:
    C-contiguous, or columns of a C-contiguous array (the kernel reads contiguous
    rows: strided ones compile to a loop several times slower)."""
    wholes = tuple(y if y.flags.c_contiguous else _whole(y) for y in ys)
    _add_lora(x, ys, wholes, *stacks, fours, four_slots)


def _whole(y):
    """The C-contiguous array whose columns y is (ops.gate_up's halves, qkv's thirds)."""
    whole = y.base
    assert whole is not None and whole.flags.c_contiguous and whole.strides == y.strides
    return whole
