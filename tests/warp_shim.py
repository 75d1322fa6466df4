"""Warp intrinsics for numba's CUDA simulator (test-only): shfl_sync, shfl_up_sync,
shfl_down_sync, shfl_xor_sync and syncwarp, which the simulator lacks.

The simulator runs each CUDA thread of a block as a Python thread. Here the lanes
of a warp (thread ids 32w .. 32w + 31 of the block, as on a GPU) meet at an
exchange: each lane leaves its value and its call, the last to arrive releases
them all, and each reads its source lane's value. An exchange fails the kernel
(a RuntimeError naming the block, warp and lanes) instead of passing by luck when:
- a lane of the warp has exited, or does not arrive within TIMEOUT_S, while
  others wait (divergent shuffles: on a GPU, undefined);
- the lanes arrive from different calls: another intrinsic, another mask, or
  another count of exchanges so far (mismatched shuffles);
- the mask is not exactly the warp's lanes (a partial last warp has fewer);
- a lane reads from a lane outside the warp (shfl_sync's src_lane).

Limits: only full-warp masks (no sub-warp groups or width argument); values
are any Python / NumPy scalars, returned as they were given; it proves the
lanes' agreement, not the GPU's timing. install() patches the simulator's
classes in this process; it needs NUMBA_ENABLE_CUDASIM=1.
"""
from __future__ import annotations

import threading
import time

TIMEOUT_S = 30.0  # a lane missing this long fails the exchange (the simulator is slow)
POLL_S = 0.02
WARP = 32
_registry_lock = threading.Lock()


class WarpError(RuntimeError):
    pass


class _Warp:
    """One warp's meeting point; generations keep consecutive exchanges apart."""

    def __init__(self, lanes: int, warp: int, block):
        self.lanes, self.warp, self.block = lanes, warp, block
        self.cond = threading.Condition()
        self.generation = 0
        self.values: dict = {}
        self.calls: dict = {}
        self.results: dict = {}
        self.error: WarpError | None = None

    def _fail(self, message: str) -> WarpError:
        self.error = WarpError(f"warp shim, block {self.block}, warp {self.warp}: {message}")
        self.cond.notify_all()
        return self.error

    def exchange(self, lane: int, call: tuple, value, threads: dict):
        with self.cond:
            if self.error:
                raise self.error
            generation = self.generation
            self.values[lane], self.calls[lane] = value, call
            if len(self.values) == self.lanes:
                self.results[generation] = (dict(self.values), dict(self.calls))
                self.results.pop(generation - 2, None)
                self.values.clear()
                self.calls.clear()
                self.generation += 1
                self.cond.notify_all()
            start = time.monotonic()
            while self.generation == generation:
                self.cond.wait(POLL_S)
                if self.error:
                    raise self.error
                if self.generation != generation:
                    break
                missing = [i for i in range(self.lanes) if i not in self.values]
                exited = [i for i in missing
                          if getattr(threads.get(self.warp * WARP + i), "_shim_exited", False)]
                if exited:
                    raise self._fail(f"lanes {exited} exited while lanes {sorted(self.values)} "
                                     f"wait in {call[0]} (divergent shuffle)")
                if time.monotonic() - start > TIMEOUT_S:
                    raise self._fail(f"lanes {missing} never reached {call[0]} within "
                                     f"{TIMEOUT_S} s (divergent shuffle)")
            values, calls = self.results[generation]
        if len(set(calls.values())) != 1:
            with self.cond:
                raise self._fail("lanes arrived from different calls (mismatched shuffles): "
                                 + ", ".join(f"lane {i}: {c}" for i, c in sorted(calls.items())))
        return values


def _current():
    """(thread, its block manager's thread table, lane, warp object)."""
    thread = threading.current_thread()
    manager = thread._manager
    threads = manager.__dict__.get("_shim_threads", {})
    lane, warp = thread.thread_id % WARP, thread.thread_id // WARP
    with _registry_lock:
        warps = manager.__dict__.setdefault("_shim_warps", {})
        if warp not in warps:
            n = 1
            for d in manager._block_dim:
                n *= d
            warps[warp] = _Warp(min(WARP, n - warp * WARP), warp, tuple(thread.blockIdx))
    return thread, threads, lane, warps[warp]


def _exchange(kind: str, mask: int, value):
    thread, threads, lane, warp = _current()
    count = getattr(thread, "_shim_count", 0)
    thread._shim_count = count + 1
    full = (1 << warp.lanes) - 1
    if mask & 0xFFFFFFFF != full:
        with warp.cond:
            raise warp._fail(f"{kind} with mask {mask:#x}; the warp's lanes are {full:#x}")
    return lane, warp, warp.exchange(lane, (kind, count, mask), value, threads)


def _source(warp, values, source: int):
    if not 0 <= source < warp.lanes:
        with warp.cond:
            raise warp._fail(f"a lane read lane {source}, outside the warp's {warp.lanes}")
    return values[source]


def shfl_sync(self, mask, value, src_lane):
    lane, warp, values = _exchange("shfl_sync", mask, value)
    return _source(warp, values, src_lane % WARP)


def shfl_up_sync(self, mask, value, delta):
    lane, warp, values = _exchange("shfl_up_sync", mask, value)
    return values[lane - delta] if lane >= delta else value


def shfl_down_sync(self, mask, value, delta):
    lane, warp, values = _exchange("shfl_down_sync", mask, value)
    return values[lane + delta] if lane + delta < warp.lanes else value


def shfl_xor_sync(self, mask, value, lane_mask):
    lane, warp, values = _exchange("shfl_xor_sync", mask, value)
    return _source(warp, values, lane ^ lane_mask)


def syncwarp(self, mask=0xFFFFFFFF):
    _exchange("syncwarp", mask, None)


def install() -> None:
    """Give the simulator's fake cuda module the warp intrinsics (idempotent)."""
    from numba.cuda.simulator import kernel, kernelapi

    module = kernelapi.FakeCUDAModule
    if getattr(module, "_warp_shim", False):
        return
    for f in (shfl_sync, shfl_up_sync, shfl_down_sync, shfl_xor_sync, syncwarp):
        setattr(module, f.__name__, f)
    module._warp_shim = True
    thread_class = kernel.BlockThread
    original_init, original_run = thread_class.__init__, thread_class.run

    def init(self, *args, **kwargs):
        original_init(self, *args, **kwargs)
        with _registry_lock:  # each block's threads by id, for the exited-lane check
            self._manager.__dict__.setdefault("_shim_threads", {})[self.thread_id] = self

    def run(self):
        try:
            original_run(self)
        finally:
            self._shim_exited = True
    thread_class.__init__, thread_class.run = init, run
