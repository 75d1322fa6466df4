"""A step's logits left on the device, and only what sampling needs copied back.

DeviceLogits is batch/step_logits.StepLogits for the CUDA backend: at its making,
the rows sampling needs whole are gathered and copied in one transfer (into a
pinned host buffer, reused step after step), and the rows that need candidates
get them from top_candidates in one launch and one small transfer. At batch 64
and a 49k vocabulary that is 64 x 2 x 2 floats a greedy decode step instead of
12.6 MB.
"""
from __future__ import annotations

import math

import numpy as np
from numba import cuda, float32, int32

from .device_function import device_function
from .disk_cache import cached_kernel
from .elementwise import ROW_THREADS, gather_rows
from .exact import NEG_INF
from .warp import FULL_MASK, WARP

TOP_THREADS = 256  # top_candidates: threads per row (8 warps)
_TOP_WARPS = TOP_THREADS // WARP
POS_INF = float32(math.inf)


@device_function
def _better(v, i, best_v, best_i):
    """(v, i) comes before (best_v, best_i): a larger value, or the same and a smaller id."""
    return v > best_v or (v == best_v and i < best_i)


@cached_kernel()
def top_candidates(logits, rows, k, out):
    """Grid (len(rows),), block TOP_THREADS: out[b, c] = (value, id as float32) of the
    c-th most likely token of row rows[b], for c < k, by value descending then id
    ascending (np.argmax's rule for ties). One pass over the row per candidate, each
    picking the best token after the last one picked: k reads of a row that stays in
    L2, and nothing to sort. (ids below 2^24 are exact as float32: every vocabulary
    here.)"""
    b, t = cuda.blockIdx.x, cuda.threadIdx.x
    lane, warp = t % WARP, t // WARP
    r = rows[b]
    n_vocab = logits.shape[1]
    shared_v = cuda.shared.array(_TOP_WARPS, float32)
    shared_i = cuda.shared.array(_TOP_WARPS, int32)
    last_v, last_i = POS_INF, int32(-1)
    for c in range(k):
        best_v, best_i = NEG_INF, int32(n_vocab)
        for j in range(t, n_vocab, TOP_THREADS):
            v, i = logits[r, j], int32(j)
            if _better(last_v, last_i, v, i) and _better(v, i, best_v, best_i):
                best_v, best_i = v, i
        offset = 16
        while offset > 0:  # the warp's best, by shuffles
            other_v = cuda.shfl_xor_sync(FULL_MASK, best_v, offset)
            other_i = cuda.shfl_xor_sync(FULL_MASK, best_i, offset)
            if _better(other_v, other_i, best_v, best_i):
                best_v, best_i = other_v, other_i
            offset //= 2
        if lane == 0:
            shared_v[warp], shared_i[warp] = best_v, best_i
        cuda.syncthreads()  # every warp's best is in shared memory
        if t == 0:
            for w in range(1, _TOP_WARPS):
                if _better(shared_v[w], shared_i[w], best_v, best_i):
                    best_v, best_i = shared_v[w], shared_i[w]
            out[b, c, 0], out[b, c, 1] = best_v, float32(best_i)
            shared_v[0], shared_i[0] = best_v, best_i
        cuda.syncthreads()  # the block's pick is in shared[0] for every thread
        last_v, last_i = shared_v[0], shared_i[0]
        cuda.syncthreads()  # all have read it before the next pass writes shared memory


class DeviceLogits:
    """batch/step_logits.StepLogits over logits (R, vocab) on the device."""

    def __init__(self, copier: "LogitsCopier", logits, needs: list[int]):
        self.copier, self.logits = copier, logits
        whole = [r for r, need in enumerate(needs) if need < 0]
        self._whole = dict(zip(whole, copier.rows_to_host(logits, whole))) if whole else {}
        reduced = [r for r, need in enumerate(needs) if need > 0]
        self._candidates = {}
        if reduced:
            found = copier.top_to_host(logits, reduced, max(needs[r] for r in reduced))
            for r, row in zip(reduced, found):  # row (k, 2): values, ids
                n = needs[r]
                self._candidates[r] = (row[:n, 0], row[:n, 1].astype(np.int64))

    def __len__(self) -> int:
        return self.logits.shape[0]

    def rows(self, rows: list[int]) -> np.ndarray:
        """Whole rows; any not copied yet (a tie among candidates, a test) are fetched."""
        missing = [r for r in rows if r not in self._whole]
        if missing:  # (a copy of their own: the pinned buffer holds the first rows)
            self._whole.update(zip(missing, self.copier.rows_to_host(self.logits, missing,
                                                                     pinned=False)))
        return np.stack([self._whole[r] for r in rows])

    def candidates(self, row: int):
        return self._candidates.get(row)


class LogitsCopier:
    """The logits' way back for one CUDA backend, in buffers reused step after step:
    device arrays for gathered rows, candidates and row indices (never the step
    workspace: the logits themselves live there), page-locked host arrays for the
    copies. Launches and copies go through (and are counted by) the backend's launcher."""

    def __init__(self, launcher):
        self.launcher = launcher
        self._buffers = {}  # by name
        self._iota = None  # 0, 1, 2, ... on the device

    def rows_to_host(self, logits, rows: list[int], pinned: bool = True) -> np.ndarray:
        """Rows of logits (R, V) on the host, in one copy: into the reused pinned buffer
        (valid until the next call), or into a new array."""
        n, vocab = len(rows), logits.shape[1]
        if rows == list(range(n)):
            src = logits[:n]
        else:
            src = self._reused("_gathered", (n, vocab), np.float32)
            self.launcher(gather_rows, n, ROW_THREADS, logits, self._row_indices(rows),
                                 src)
        self.launcher.transfers += 1
        self.launcher.bytes_to_host += n * vocab * 4
        if not pinned:
            return src.copy_to_host()
        host = self._pinned_host("_whole_rows", (n, vocab))
        src.copy_to_host(host)
        return host

    def top_to_host(self, logits, rows: list[int], k: int) -> np.ndarray:
        """(len(rows), k, 2): the k most likely (value, id) of each row, found on the
        device, one launch and one small copy (logits.top_candidates)."""
        out = self._reused("_top", (len(rows), k, 2), np.float32)
        self.launcher(top_candidates, len(rows), TOP_THREADS, logits,
                             self._row_indices(rows), k, out)
        self.launcher.transfers += 1
        self.launcher.bytes_to_host += out.size * 4
        host = self._pinned_host("_top_host", (len(rows), k, 2))
        out.copy_to_host(host)
        return host

    def _row_indices(self, rows: list[int]):
        """rows as a device int32 array: a view of a fixed 0, 1, 2, ... when they are
        that (a decode step's rows), else uploaded (one transfer)."""
        n = len(rows)
        if self._iota is None or self._iota.shape[0] < n:
            self._iota = cuda.to_device(np.arange(max(n, 256), dtype=np.int32))
        if rows == list(range(n)):
            return self._iota[:n]
        indices = self._reused("_indices", (n,), np.int32)
        indices.copy_to_device(np.asarray(rows, dtype=np.int32))
        self.launcher.transfers += 1
        return indices

    def _reused(self, name: str, shape: tuple, dtype):
        """A device array of shape from a buffer kept under name, grown when too small
        (never the step workspace: the logits themselves live there)."""
        n = int(np.prod(shape))
        buffer = self._buffers.get(name)
        if buffer is None or buffer.size < n:
            buffer = self._buffers[name] = cuda.device_array(max(n, 2 * (0 if buffer is None
                                                                        else buffer.size)), dtype)
        return buffer[:n].reshape(shape)

    def _pinned_host(self, name: str, shape: tuple) -> np.ndarray:
        """A float32 host array in page-locked memory (a faster copy), reused."""
        n = int(np.prod(shape))
        buffer = self._buffers.get(name)
        if buffer is None or buffer.size < n:
            buffer = self._buffers[name] = cuda.pinned_array(
                max(n, 2 * (0 if buffer is None else buffer.size)), np.float32)
        return buffer[:n].reshape(shape)

