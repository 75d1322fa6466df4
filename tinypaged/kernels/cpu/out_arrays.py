"""Output arrays of the packed products: the large ones from a per-step workspace.

A product's output larger than the caches (Gemma 3's logits at 32 rows: 32 x
262,144 float32, 33.5 MB) is a fresh mapping from the kernel at every call, paid
for in page faults and the kernel's zeroing: measured 35 ms for the lm_head's GEMM
into a fresh array against 25 ms into one used before (bench/NOTES.md). So within a
step (`step_workspace()`, the scope of one forward pass) each large output comes
from the thread's pool: an array of its shape not handed out yet in this step,
else a new one, kept for the steps after. The step's outputs live until the
thread's next step begins: the engine consumes a step's logits within the step,
and `to_host` copies them out of the pool for a caller that keeps them. Outside a
step, and for small outputs (the allocator's free lists serve those cheaply),
every output is fresh.
"""
from __future__ import annotations

import threading
from contextlib import contextmanager

import numpy as np

REUSE_BYTES = 8 << 20  # outputs from this size up come from the pool
KEPT_PER_SHAPE = 4  # arrays of one shape a thread keeps; a step needing more gets fresh ones


class _Pool(threading.local):
    def __init__(self):
        self.arrays: dict[tuple, list] = {}  # shape -> kept arrays
        self.taken: dict[tuple, int] = {}  # shape -> how many of them this step has handed out
        self.depth = 0  # step_workspace() scopes open (a forward's, nested ones join it)


_pool = _Pool()


@contextmanager
def step_workspace():
    """One step's scope: on entering it, every kept array is free to be handed out
    again (the previous step's outputs are overwritten by this one's)."""
    pool = _pool
    if pool.depth == 0:
        pool.taken = {}
    pool.depth += 1
    try:
        yield
    finally:
        pool.depth -= 1


def output_array(rows: int, cols: int) -> np.ndarray:
    """An uninitialised float32 (rows, cols) array for a product to fill."""
    pool = _pool
    if rows * cols * 4 < REUSE_BYTES or pool.depth == 0:
        return np.empty((rows, cols), dtype=np.float32)
    shape = (rows, cols)
    kept = pool.arrays.setdefault(shape, [])
    i = pool.taken.get(shape, 0)
    if i == len(kept):
        if i == KEPT_PER_SHAPE:
            return np.empty(shape, dtype=np.float32)
        kept.append(np.empty(shape, dtype=np.float32))
    pool.taken[shape] = i + 1
    return kept[i]


def from_pool(x: np.ndarray) -> bool:
    """Whether x is (or views) an array of this thread's pool."""
    base = x if x.base is None else x.base
    return any(base is a for kept in _pool.arrays.values() for a in kept)
