"""Output arrays of the matrix products, the large ones reused from call to call.

A product's output larger than the caches (Gemma 3's logits at 32 rows: 32 x
262,144 float32, 33.5 MB) is a fresh mapping from the kernel at every call, paid
for in page faults and the kernel's zeroing: measured 35 ms for the lm_head's
GEMM into a fresh array against 25 ms into one used before (bench/NOTES.md). So
each thread keeps its last few large outputs, and hands one out again once
nothing else holds it (its reference count says so: a caller still holding the
logits, or a view of them, keeps them out of reach). Smaller outputs come from
the allocator's free lists, cheaply, and are not kept.
"""
from __future__ import annotations

import sys
import threading

import numpy as np

REUSE_BYTES = 8 << 20  # outputs from this size up are kept for reuse
KEPT_PER_SHAPE = 2  # at most this many of one shape kept by a thread
_kept = threading.local()


def _references(kept: list, i: int) -> int:
    return sys.getrefcount(kept[i])


# what _references counts for an array that only its kept list holds, measured once
# through the same call (interpreters differ in the references they count: 3.14
# counts fewer); any other holder, or a view of the array, adds to it
_FREE_REFERENCES = _references([np.empty(0)], 0)


def output_array(rows: int, cols: int) -> np.ndarray:
    """An uninitialised float32 (rows, cols) array for a product to fill."""
    if rows * cols * 4 < REUSE_BYTES:
        return np.empty((rows, cols), dtype=np.float32)
    by_shape = getattr(_kept, "arrays", None)
    if by_shape is None:
        by_shape = _kept.arrays = {}
    kept = by_shape.setdefault((rows, cols), [])
    for i in range(len(kept)):
        if _references(kept, i) == _FREE_REFERENCES:
            return kept[i]
    array = np.empty((rows, cols), dtype=np.float32)
    if len(kept) < KEPT_PER_SHAPE:
        kept.append(array)
    return array
