"""A cooperative scheduler for numba's CUDA simulator, with the warp intrinsics it
lacks (test-only): shfl_sync, shfl_up_sync, shfl_down_sync, shfl_xor_sync, syncwarp.

Why a scheduler: the simulator runs each CUDA thread of a block as an OS thread,
and its BlockManager polls them in a loop that holds the GIL, so every barrier
costs milliseconds of GIL hand-offs. Here each CUDA thread is a greenlet (a
stack switched within one OS thread, microseconds a switch), and one baton passes
between them: a thread runs alone until it reaches a barrier (syncthreads, a
shuffle, syncwarp) or exits, then hands the baton back. When every thread is
parked the scheduler releases what can go on: a warp whose lanes all wait in the
same exchange (their values are swapped then), else the whole block when every
live thread waits in syncthreads (exited threads count as arrived, as on a GPU).
Runs are deterministic (lanes in thread-id order), atomics included.

An exchange fails the kernel with a WarpError (a RuntimeError naming the block,
warp and lanes) instead of passing by luck when:
- a lane of the warp has exited while others wait in it (divergent shuffle);
- the lanes wait in different calls: another intrinsic, another mask, another
  count of exchanges so far (mismatched shuffles), or some lanes in a shuffle
  while the rest of the block waits in syncthreads;
- the mask is not exactly the warp's lanes (a partial last warp has fewer);
- a lane reads from a lane outside the warp (shfl_sync's src_lane).

In-kernel arrays are the plain NumPy arrays behind the simulated device arrays
(same indexing and values; the simulator's wrapper only adds record-style field
access, several calls per element read); device functions called from a kernel
of their module and `float32(x)` casts skip per-call bookkeeping.

Limits: only full-warp masks (no sub-warp groups or width argument); values are
any Python / NumPy scalars, returned as they were given; blocks run one after
another, threads one at a time, so it proves the lanes' agreement, not the
GPU's timing or its memory ordering. install() patches the simulator in this
process; it needs NUMBA_ENABLE_CUDASIM=1.
"""
from __future__ import annotations

import sys
import threading

import numpy as np

WARP = 32
SYNCTHREADS = ("syncthreads",)


class WarpError(RuntimeError):
    pass


class SimThread:
    """One CUDA thread of a block: a greenlet that runs only while it holds the baton,
    with what the simulator's kernel API asks of `threading.current_thread()`."""

    def __init__(self, manager, run, block_idx, thread_idx, thread_id: int):
        from greenlet import greenlet

        self._manager, self._run = manager, run
        self.blockIdx, self.threadIdx, self.thread_id = block_idx, thread_idx, thread_id
        self.glet = greenlet(self._main, parent=greenlet.getcurrent())
        self.waiting = None  # what it is parked in: SYNCTHREADS or an exchange call
        self.value = None  # its value in the exchange it waits in
        self.received = None  # the warp's values when that exchange completed
        self.exchanges = 0  # exchanges made so far (mismatch check)
        self.exception = None
        self.done = False

    def _main(self):
        try:
            self._run()
        except Exception as e:  # reported as the simulator does: thread and block first
            where = f"tid={list(self.threadIdx)} ctaid={list(self.blockIdx)}"
            try:
                error = type(e)(f"{where}: {e}" if str(e) else where)
            except TypeError:
                error = e
            self.exception = (error, e.__traceback__)
        finally:
            self.done = True

    def park(self, call) -> None:
        """Hand the baton back until the scheduler releases this thread."""
        self.waiting = call
        self.glet.parent.switch()
        self.waiting = None

    def syncthreads(self):
        self.park(SYNCTHREADS)

    def _syncthreads_reduce(self, value, reduce):
        state = self._manager.block_state
        state[tuple(self.threadIdx)[:state.ndim]] = value
        self.syncthreads()
        result = reduce(state)
        self.syncthreads()
        return result

    def syncthreads_count(self, value):
        return int(self._syncthreads_reduce(value, np.count_nonzero))

    def syncthreads_and(self, value):
        return int(bool(self._syncthreads_reduce(value, np.all)))

    def syncthreads_or(self, value):
        return int(bool(self._syncthreads_reduce(value, np.any)))


_current: list = [None]  # the SimThread holding the baton, inside a kernel


def current_thread():
    return _current[0]


class CooperativeBlockManager:
    """Runs one block (replaces the simulator's BlockManager; same interface)."""

    def __init__(self, f, grid_dim, block_dim, debug):
        self._f, self._grid_dim, self._block_dim, self._debug = f, grid_dim, block_dim, debug
        self.block_state = np.zeros(block_dim, dtype=np.bool_)  # syncthreads_count & co

    def run(self, grid_point, *args):
        from numba.cuda.simulator.kernelapi import Dim3

        def target():
            self._f(*args)

        bx, by, _ = (tuple(self._block_dim) + (1, 1))[:3]
        block_idx, threads = Dim3(*grid_point), []
        for point in np.ndindex(*self._block_dim):
            x, y, z = (tuple(point) + (0, 0))[:3]
            threads.append(SimThread(self, target, block_idx, Dim3(x, y, z),
                                     x + bx * (y + by * z)))
        threads.sort(key=lambda t: t.thread_id)
        self.block = tuple(grid_point)
        n = len(threads)
        self.lanes_of = [min(WARP, n - w * WARP) for w in range(-(-n // WARP))]
        self._schedule(threads)

    def _resume(self, t) -> None:
        _current[0] = t
        try:
            t.glet.switch()
        finally:
            _current[0] = None
        if t.exception:
            raise t.exception[0].with_traceback(t.exception[1])

    def _schedule(self, threads) -> None:
        runnable = threads
        while True:
            for t in runnable:
                self._resume(t)
            live = [t for t in threads if not t.done]
            if not live:
                return
            runnable = self._released_warps(threads)
            if not runnable:
                if all(t.waiting == SYNCTHREADS for t in live):
                    runnable = live
                else:
                    raise self._deadlock(threads)

    def _released_warps(self, threads) -> list:
        """Lanes of every warp whose lanes all wait in one exchange, values handed out."""
        released = []
        for w, n_lanes in enumerate(self.lanes_of):
            lanes = threads[w * WARP:w * WARP + n_lanes]
            calls = [t.waiting for t in lanes]
            if any(c is None or c == SYNCTHREADS for c in calls):
                continue
            if len(set(calls)) != 1:
                raise self._error(w, "lanes wait in different calls (mismatched shuffles): "
                                  + ", ".join(f"lane {i}: {c}" for i, c in enumerate(calls)))
            values = _Values(t.value for t in lanes)
            for t in lanes:
                t.received = values
            released += lanes
        return released

    def _deadlock(self, threads) -> WarpError:
        for w, n_lanes in enumerate(self.lanes_of):
            lanes = threads[w * WARP:w * WARP + n_lanes]
            in_exchange = [i for i, t in enumerate(lanes)
                           if t.waiting not in (None, SYNCTHREADS)]
            if not in_exchange:
                continue
            call = lanes[in_exchange[0]].waiting[0]
            exited = [i for i, t in enumerate(lanes) if t.done]
            if exited:
                return self._error(w, f"lanes {exited} exited while lanes {in_exchange} wait "
                                   f"in {call} (divergent shuffle)")
            others = [i for i, t in enumerate(lanes) if i not in in_exchange]
            return self._error(w, f"lanes {others} wait in syncthreads while lanes "
                               f"{in_exchange} wait in {call} (divergent or mismatched)")
        return WarpError(f"warp shim, block {self.block}: threads wait in syncthreads while "
                         "others wait in exchanges")

    def _error(self, warp: int, message: str) -> WarpError:
        return WarpError(f"warp shim, block {self.block}, warp {warp}: {message}")


def _exchange(kind: str, mask: int, value) -> tuple:
    """Park in an exchange with the rest of the warp: (lane, lanes in warp, values)."""
    thread = current_thread()
    manager = thread._manager
    warp, lane = divmod(thread.thread_id, WARP)
    n_lanes = manager.lanes_of[warp]
    full = (1 << n_lanes) - 1
    if mask & 0xFFFFFFFF != full:
        raise manager._error(warp, f"{kind} with mask {mask:#x}; the warp's lanes are {full:#x}")
    thread.value = value
    thread.park((kind, thread.exchanges, mask & 0xFFFFFFFF))
    thread.exchanges += 1
    return lane, n_lanes, thread.received


def _source(n_lanes: int, values, source: int):
    if not 0 <= source < n_lanes:
        thread = current_thread()
        raise thread._manager._error(thread.thread_id // WARP,
                                     f"a lane read lane {source}, outside the warp's {n_lanes}")
    return values[source]


class _Values(list):
    """The warp's values in one exchange, shared by its lanes; `reduced` holds a
    reduction's lane results once the first lane has computed them."""
    reduced = None


def _butterfly(kind: str, value, combine):
    """One exchange in place of a warp reduction's five shuffles: the lanes' results
    as the butterfly gives them (lane i combines its value with lane i ^ offset's, for
    offsets 16, 8, 4, 2, 1, in that order: the same arithmetic, so the same bits)."""
    lane, n_lanes, values = _exchange(kind, 0xFFFFFFFF, value)  # (a partial warp is refused)
    if values.reduced is None:
        v = list(values)
        offset = WARP // 2
        while offset:
            v = [combine(v[i], v[i ^ offset]) for i in range(WARP)]
            offset //= 2
        values.reduced = v
    return values.reduced[lane]


def fast_warp_sum(value):
    return _butterfly("warp_sum", value, lambda a, b: a + b)


def fast_warp_max(value):
    return _butterfly("warp_max", value, max)


def shfl_sync(self, mask, value, src_lane):
    lane, n_lanes, values = _exchange("shfl_sync", mask, value)
    return _source(n_lanes, values, src_lane % WARP)


def shfl_up_sync(self, mask, value, delta):
    lane, n_lanes, values = _exchange("shfl_up_sync", mask, value)
    return values[lane - delta] if lane >= delta else value


def shfl_down_sync(self, mask, value, delta):
    lane, n_lanes, values = _exchange("shfl_down_sync", mask, value)
    return values[lane + delta] if lane + delta < n_lanes else value


def shfl_xor_sync(self, mask, value, lane_mask):
    lane, n_lanes, values = _exchange("shfl_xor_sync", mask, value)
    return _source(n_lanes, values, lane ^ lane_mask)


def syncwarp(self, mask=0xFFFFFFFF):
    _exchange("syncwarp", mask, None)


class _ThreadingView:
    """`threading` as the kernel API sees it: current_thread() is the CUDA thread
    holding the baton (the OS thread outside kernels); the rest is threading."""

    def __getattr__(self, name):
        return getattr(threading, name)

    @staticmethod
    def current_thread():
        return _current[0] or threading.current_thread()


def install() -> None:
    """Patch the simulator in this process: the cooperative block manager and the
    warp intrinsics (idempotent)."""
    from numba.cuda.simulator import kernel, kernelapi

    module = kernelapi.FakeCUDAModule
    if getattr(module, "_warp_shim", False):
        return
    for f in (shfl_sync, shfl_up_sync, shfl_down_sync, shfl_xor_sync, syncwarp):
        setattr(module, f.__name__, f)
    module._warp_shim = True
    kernel.BlockManager = CooperativeBlockManager
    # the kernel API's threadIdx, blockIdx, laneid and syncthreads* ask the current
    # thread; the CUDA threads here are greenlets of one OS thread
    kernelapi.threading = _ThreadingView()
    wrapper = kernel.FakeWithinKernelCUDAArray

    def within_kernel(array):
        """A kernel sees the plain NumPy array behind a simulated device array: the
        simulator's wrapper (record-style field access, which no kernel here uses)
        costs several calls per element read."""
        return wrapper(array) if array._ary.dtype.fields is not None else array._ary
    kernel.FakeWithinKernelCUDAArray = within_kernel
    _speed_up_calls(kernel, kernelapi)
    from tinypaged.kernels.cuda import warp
    warp.warp_sum._shim_fast, warp.warp_max._shim_fast = fast_warp_sum, fast_warp_max


def _speed_up_calls(kernel, kernelapi) -> None:
    """Three per-call costs of simulated code, gone: a device function called from a
    kernel of its own module swaps that module's `cuda` global again (a lock and a
    scan of the globals per call), `float32(x)` imports numba's typing each time, and
    cuda.shared.array finds its call site by extracting the whole stack (with each
    frame's source line) where the caller's frame gives the same file and line."""
    from numba.core.types import abstract
    from numba.core.typing import signature
    from numba.np import numpy_support

    fake_kernel = kernel.FakeCUDAKernel
    original_call = fake_kernel.__call__

    def call(self, *args):
        fast = self.__dict__.get("_shim_fast")
        if fast is not None:  # (a warp reduction: one exchange; see _butterfly)
            return fast(*args)
        if self._device and isinstance(self.fn.__globals__.get("cuda"), kernelapi.FakeCUDAModule):
            return self.fn(*args)  # already running against the fake module
        return original_call(self, *args)
    fake_kernel.__call__ = call

    scalars = {float, int, bool, np.float16, np.float32, np.float64, np.int8, np.int16,
               np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64}

    def cast_or_signature(self, *args):
        if len(args) == 1 and (type(args[0]) in scalars or not isinstance(args[0], abstract.Type)):
            return self.cast_python_value(args[0])  # (the set first: abc's check is slow)
        return signature(self, *args)
    abstract.Type.__call__ = cast_or_signature

    shared_array = kernelapi.FakeCUDAShared.array

    def shared(self, shape, dtype):
        if shape == 0:  # (dynamic shared memory: the simulator's own way)
            return shared_array(self, shape, dtype)
        if isinstance(dtype, abstract.Type):
            dtype = numpy_support.as_dtype(dtype)
        frame = sys._getframe(1)
        caller = (frame.f_code.co_filename, frame.f_lineno)  # (as the simulator keys it)
        array = self._allocations.get(caller)
        if array is None:
            array = self._allocations[caller] = np.empty(shape, dtype)
        return array
    kernelapi.FakeCUDAShared.array = shared
