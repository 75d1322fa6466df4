"""The machine's state as a benchmark sees it: what a cache line costs one core to read
after the other core wrote it.

On the 2-core VM this project is measured on, that cost is ~7 ns in one state and
~45 ns in another, and the state flips by itself over seconds to minutes (the host
placing the two vCPUs on cores that share an L3, or not). A 32-request decode step
hands each layer's activations between the cores (a product's threads write its output
by columns, the next op reads whole rows), so its rate moves ~15% with the state while
one long parallel call (the lm_head) does not (bench/NOTES.md, 2026-12-05, the
seventeenth session). Printed beside each round of a rate, it says which state the
round ran in.
"""
from __future__ import annotations

import time

import numpy as np
from numba import prange

from ..jit_cache import cached_njit

VALUES = 196_608  # 768 KB of float32 (a 32-row step's gate/up output, Qwen3-0.6B)
LINE = 16  # float32 values a 64-byte line


@cached_njit(parallel=True)
def _write_halves(buf, value):
    """The buffer's first half written by numba's thread 0 (the caller), the second by
    thread 1 (a static schedule: contiguous halves)."""
    half = buf.size // 2
    for c in prange(2):
        for i in range(c * half, (c + 1) * half):
            buf[i] = value


@cached_njit()
def _read_lines(buf):
    total = np.float32(0.0)
    for i in range(0, buf.size, LINE):
        total += buf[i]
    return total


def cross_core_ns(repeats: int = 50) -> float:
    """ns a line for this thread to read a buffer of which the other thread has just
    written half: (write, then read) less (write alone), over the lines of that half.
    Call it on the thread whose parallel team is measured (bench.rates.on_engine_thread):
    a second thread's parallel call makes numba start a second team."""
    buf = np.zeros(VALUES, np.float32)
    _write_halves(buf, 1.0)
    _read_lines(buf)
    start = time.perf_counter()
    for _ in range(repeats):
        _write_halves(buf, 1.0)
    written = time.perf_counter() - start
    start = time.perf_counter()
    for _ in range(repeats):
        _write_halves(buf, 1.0)
        _read_lines(buf)
    both = time.perf_counter() - start
    return max(0.0, both - written) / repeats / (VALUES // LINE // 2) * 1e9
