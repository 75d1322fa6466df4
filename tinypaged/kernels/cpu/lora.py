"""LoRA's low-rank terms on the CPU (reference.add_lora is the spec): per batch row,
t = x A^T * scale (r values), then y += t B^T, reading the row's slot's A and B^T
(float32, or float16 widened as read). The products that share an input (q, k, v;
gate, up) go in one call: a call's fixed cost was a third of the terms' (bench/lora.py).

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
from .lora_ir import ROWS, columns_in, expand_lanes
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
def _add_lora(x, products, wholes, a_s, bts, ranks_s, scales_s, widest, fours, four_slots):
    """Each term m: products[m], which is wholes[m][:, column:column + out] (the
    C-contiguous array it is columns of), gains its terms."""
    columns = columns_in(products, wholes)
    for f in prange(fours.shape[0]):
        s = four_slots[f]
        rr = fours[f]
        first = rr[0]
        x0, x1 = x[first], x[rr[1] if rr[1] >= 0 else first]
        x2, x3 = x[rr[2] if rr[2] >= 0 else first], x[rr[3] if rr[3] >= 0 else first]
        t = np.empty((ROWS, a_s[0].shape[1]), np.float32)
        sums = np.empty((ROWS, widest), np.float32)
        for m in range(len(wholes)):
            r = ranks_s[m][s]
            if r == 0:
                continue
            r4 = -(-r // ROWS) * ROWS
            _shrink4(x0, x1, x2, x3, a_s[m][s], r4, scales_s[m][s], t)
            for j in range(r, r4):  # (the padding's terms: zero)
                t[0, j] = t[1, j] = t[2, j] = t[3, j] = float32(0.0)
            _expand4(t, bts[m][s], r4, sums, rr, wholes[m], columns[m])


def lora_groups(rows, slots):
    """The step's adapted rows as add_lora takes them: fours of one slot (_fours)."""
    return _fours(rows, slots)


def upload(x: np.ndarray) -> np.ndarray:
    """A LoRA stack as the kernel reads it: float16 as its bits (widened())."""
    return x.view(np.uint16) if x.dtype == np.float16 else x


def lora_stacks(stacks):
    """reference.lora_stacks: (a_s, bts, ranks, scales, widest) of the products' stacks
    ((a, bt, ranks, scales) each, as upload() holds them), the tuples the kernel takes."""
    a_s, bts, ranks, scales = (tuple(part) for part in zip(*stacks))
    return a_s, bts, ranks, scales, max(bt.shape[2] for bt in bts)


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
