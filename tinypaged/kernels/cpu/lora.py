"""LoRA's low-rank terms on the CPU (reference.add_lora is the spec): per batch row,
x A^T (r values) then those times B^T added into the row, reading its slot's A and B.

Rows come grouped by slot, so a slot's A and B (r * (in + out) floats: 74 KB for a
rank-16 product of 576 by 576) stay in cache across its rows. Each row's sums run
in the same order whatever else is in the batch: a row's result does not depend on
its neighbours (a batch mixing adapters equals each alone, bit for bit).
Single-threaded: at decode batch sizes the terms cost less than a parallel launch.
"""
import numpy as np
from numba import float32

from ...config import MAX_LORA_RANK
from ...jit_cache import cached_njit


@cached_njit(fastmath=True)
def _add_lora(y, x, a, bt, ranks, scales, rows, slots):
    t = np.empty(MAX_LORA_RANK, np.float32)  # one row's x A^T, scaled
    n_in, n_out = x.shape[1], y.shape[1]
    for k in range(len(rows)):
        row, s = rows[k], slots[k]
        r = ranks[s]
        for j in range(r):
            acc = float32(0.0)
            for i in range(n_in):
                acc += x[row, i] * a[s, j, i]
            t[j] = acc * scales[s]
        for j in range(r):
            c = t[j]
            for o in range(n_out):
                y[row, o] += c * bt[s, j, o]


def add_lora(y, x, a, bt, ranks, scales, rows, slots):
    """reference.add_lora: y (T, out) += each adapted row's low-rank term, in place."""
    _add_lora(y, x, a, bt, ranks, scales, rows, slots)
    return y
