"""EngineLoop: one background thread owns the LLMEngine; any number of callers share it.

Callers (threads, asyncio tasks, HTTP handlers) never touch the engine. They hand
commands to the loop through its inbox: add a request (and get its RequestStream),
abort one, or run a function on the engine between two steps. The loop thread
applies the queued commands, runs one step, hands each request's new output to its
stream, and repeats while there is work; with none, it sleeps on the inbox until
the next command (no busy waiting).

The inbox is a queue.SimpleQueue, whose put() is reentrant and never waits on the
loop: an abort can be posted from a __del__ or a finalizer, where Python may run
it at any moment, even while the same thread is inside the queue (see
interrupts.py for the Ctrl+C that may land there).

Failures: the engine fails only the requests a failed step concerns (their streams
raise the error) and goes on. An exception that escapes a step means the engine's
bookkeeping broke: the loop then marks the engine dead, every waiting caller gets
an EngineDeadError, and so does every later call.
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import itertools
import queue
import threading
import time
from collections import OrderedDict, deque
from typing import Callable

import numba

from ..outputs import CompletionOutput, RequestOutput
from .llm_engine import LLMEngine
from .loop_metrics import LoopMetrics
from .output_stream import RequestStream
from .request import PreparedRequest


class EngineDeadError(RuntimeError):
    """The engine loop has stopped: closed, or broken by an internal error."""


class EngineLoop:
    def __init__(self, engine: LLMEngine):
        self.engine = engine
        self.metrics = LoopMetrics()
        self._inbox: queue.SimpleQueue[tuple] = queue.SimpleQueue()  # commands, in order
        self._lock = threading.Lock()  # guards the fields below up to _thread
        self._streams: dict[str, RequestStream] = {}  # live requests, by id
        self._num_queued_adds = 0  # added but not yet taken into the engine
        self._queued_samples = 0  # their samples (n each)
        self._waiting_samples = 0  # samples in the engine (or held) not running yet, as of the last publish
        self._dead: EngineDeadError | None = None
        self._thread: threading.Thread | None = None
        self._ids = itertools.count()
        # owned by the loop thread
        self._exclusive: deque[tuple[Callable, concurrent.futures.Future]] = deque()
        # adds held back while an exclusive call waits, by request id (in arrival order)
        self._held: OrderedDict[str, tuple[PreparedRequest, RequestStream]] = OrderedDict()
        self._held_samples = 0
        self._cores_lent = 0  # (lend_core) numba threads the steps leave to other work
        self._step_threads = 1  # numba's threads in the loop thread, as it started (_run)

    # -- callers' side (any thread) ----------------------------------------------
    def submit(self, prepared: PreparedRequest, request_id: str | None = None) -> RequestStream:
        """Queue a checked request; its outputs arrive on the returned stream."""
        return self.submit_all([prepared], [request_id])[0]

    def submit_all(self, prepared: list[PreparedRequest], request_ids: list[str | None]) -> list[RequestStream]:
        """Queue checked requests as one command: the loop takes them all before its next
        step, so a batch is scheduled as one whatever the threads' timing (a first step
        on part of it would change what runs together and what is preempted)."""
        with self._lock:
            self._check_alive()
            taken = set()
            for request_id in request_ids:
                if request_id is not None and (request_id in self._streams or request_id in taken):
                    raise ValueError(f"request_id {request_id!r} is already in use")
                taken.add(request_id)
            streams = []
            for request_id in request_ids:
                while request_id is None or request_id in self._streams:
                    request_id = f"req-{next(self._ids)}"
                streams.append(RequestStream(request_id))
                self._streams[request_id] = streams[-1]
            self._num_queued_adds += len(prepared)
            self._queued_samples += sum(p.params.n for p in prepared)
            self._send_locked(("add", list(zip(prepared, streams))))
        return streams

    def abort(self, request_id: str) -> None:
        """Ask the loop to stop a request (its blocks are freed before the next step).
        Unknown or finished requests are ignored: an abort may race the finish.
        Takes no lock and never waits: safe in a finalizer."""
        if self._dead is None and request_id in self._streams:
            self._inbox.put(("abort", request_id))

    def abort_all(self) -> None:
        """Abort every request that is queued or running (a server shutting down)."""
        with self._lock:
            request_ids = list(self._streams) if self._dead is None else []
        for request_id in request_ids:
            self._inbox.put(("abort", request_id))

    def call(self, fn: Callable[[], object], exclusive: bool = False):
        """Run fn() on the loop thread between two steps and return its result (or
        raise its exception) in the calling thread.
        exclusive: first let the running requests finish and hold new ones back, so
        that fn has the engine to itself (beam search)."""
        future: concurrent.futures.Future = concurrent.futures.Future()
        with self._lock:
            self._check_alive()
            self._send_locked(("exclusive" if exclusive else "call", fn, future))
        return future.result()

    @contextlib.contextmanager
    def lend_core(self):
        """While the block runs, the engine's steps use one numba thread fewer (one
        stays): for CPU work beside the engine, such as compiling a grammar. A parallel
        step runs at the pace of its slowest thread, so a step sharing a core with
        other work ran 2-4x slower on two cores; one thread fewer costs it ~1.3x."""
        with self._lock:
            self._cores_lent += 1
        try:
            yield
        finally:
            with self._lock:
                self._cores_lent -= 1

    @property
    def num_waiting(self) -> int:
        """Requests not running yet: queued for the loop, or waiting in the scheduler
        (as of the last step)."""
        with self._lock:
            return self._num_queued_adds + self.metrics.num_waiting()

    @property
    def num_waiting_samples(self) -> int:
        """Sequences still to be admitted, a request of n samples counting n: what a
        queue of waiting work costs (a server's admission limit)."""
        with self._lock:
            return self._queued_samples + self._waiting_samples

    @property
    def is_alive(self) -> bool:
        return self._dead is None

    def stop(self) -> None:
        """Tell the loop to end after its current step: unfinished requests are
        aborted, their callers get EngineDeadError. Takes no lock and never waits
        (what an LLM's finalizer calls); idempotent."""
        if self._dead is None:
            self._dead = EngineDeadError("the LLM was closed")
        self._inbox.put(("wake",))

    def close(self, timeout: float | None = 10.0) -> None:
        """stop(), then wait for the loop thread to end."""
        self.stop()
        with self._lock:
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
        elif thread is None:
            self._fail_everything(self._dead)

    def _check_alive(self) -> None:
        if self._dead is not None:
            raise self._dead

    def _send_locked(self, command: tuple) -> None:
        self._inbox.put(command)
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="tinypaged-engine-loop",
                                            daemon=True)
            self._thread.start()

    # -- the loop thread ---------------------------------------------------------
    def _run(self) -> None:
        try:
            self.engine.use_in_this_thread()
            threads = self._step_threads = numba.get_num_threads()
            has_work = False
            while True:
                commands = [] if has_work else [self._inbox.get()]  # idle: sleep until one
                commands += drain(self._inbox)
                if self._dead is not None:
                    break
                for command in commands:
                    self._apply(command)
                self._publish_state(commands)
                # Hold no command while waiting: a call's closure can hold its LLM,
                # which then could never be collected nor this thread end.
                commands = command = None
                if self.engine.has_unfinished():
                    wanted = max(1, self._step_threads - self._cores_lent)
                    if wanted != threads:  # (lend_core; numba's count is per thread)
                        numba.set_num_threads(wanted)
                        threads = wanted
                    self._step()
                elif self._exclusive:
                    self._run_exclusive()
                has_work = self.engine.has_unfinished() or bool(self._exclusive)
        except BaseException as e:  # a bug in the loop or the engine's bookkeeping
            dead = EngineDeadError(f"the engine stopped after an internal error: {e!r}; "
                                   f"create a new LLM")
            dead.__cause__ = e
            with self._lock:
                self._dead = self._dead or dead
        self._fail_everything(self._dead)

    def _apply(self, command: tuple) -> None:
        kind = command[0]
        if kind == "add":
            for prepared, stream in command[1]:
                if self._exclusive:
                    self._held[stream.request_id] = (prepared, stream)
                    self._held_samples += prepared.params.n
                else:
                    self._add(prepared, stream)
        elif kind == "abort":
            self._abort(command[1])
        elif kind == "call":
            _, fn, future = command
            self._run_call(fn, future)
        elif kind == "exclusive":
            self._exclusive.append(command[1:])
        # ("wake",) asks nothing: it ends the inbox's wait (stop())

    def _add(self, prepared: PreparedRequest, stream: RequestStream) -> None:
        try:
            self.engine.add_prepared(prepared, stream.request_id)
        except Exception as e:  # e.g. the id is still taken by a request added directly
            self._end(stream, error=e)

    def _abort(self, request_id: str) -> None:
        stream = self._streams.get(request_id)
        if stream is None:
            return
        if request_id in self.engine.requests:
            out = self.engine.abort(request_id)
        else:
            held = self._held.pop(request_id, None)
            if held is None:
                return
            self._held_samples -= held[0].params.n
            out = aborted_output(held[0], request_id)
        self.metrics.observe(stream, out, time.monotonic())
        self._end(stream, out)

    def _step(self) -> None:
        outputs = self.engine.step()  # an exception here ends the loop (see _run)
        # (a request with no stream was added to the engine directly, not by the loop)
        pairs = [(self._streams.get(out.request_id), out) for out in outputs]
        pairs = [(stream, out) for stream, out in pairs if stream is not None]
        self.metrics.observe_step(pairs, time.monotonic())
        for stream, out in pairs:
            if out.error is not None:
                self._end(stream, error=out.error)
            elif out.finished:
                self._end(stream, out)
            else:
                stream.put(out)
        self._publish_state()

    def _run_exclusive(self) -> None:
        """The engine is drained: run the exclusive calls, then let held requests in."""
        while self._exclusive:
            fn, future = self._exclusive.popleft()
            self._run_call(fn, future)
        while self._held:
            prepared, stream = self._held.popitem(last=False)[1]
            self._held_samples -= prepared.params.n
            self._add(prepared, stream)

    @staticmethod
    def _run_call(fn, future: concurrent.futures.Future) -> None:
        if not future.set_running_or_notify_cancel():
            return
        try:
            future.set_result(fn())
        except Exception as e:
            future.set_exception(e)

    def _end(self, stream: RequestStream, output: RequestOutput | None = None,
             error: BaseException | None = None) -> None:
        with self._lock:
            self._streams.pop(stream.request_id, None)
        if error is not None:
            stream.fail(error)
        else:
            stream.put(output)

    def _publish_state(self, applied: list[tuple] = ()) -> None:
        """The gauges after a step or a batch of commands (applied: the commands just
        taken, whose adds leave the queued counts as they enter the engine's, at once).
        Costs O(running sequences), never O(waiting): a request runs if any of its
        samples runs, and waits otherwise (a half-preempted request counts once)."""
        sched, bm = self.engine.scheduler, self.engine.block_manager
        running = len({s.request_id for s in sched.running})
        waiting = len(self.engine.requests) - running + len(self._held)
        adds = [prepared for c in applied if c[0] == "add" for prepared, _ in c[1]]
        with self._lock:
            self._num_queued_adds -= len(adds)
            self._queued_samples -= sum(p.params.n for p in adds)
            self._waiting_samples = sched.waiting_seats + self._held_samples
            spec = sched.speculation
            self.metrics.set_engine_state(running, waiting, bm.num_blocks - bm.num_free_blocks,
                                          bm.num_blocks, bm.prefix_query_tokens,
                                          bm.prefix_hit_tokens, sched.num_preemptions,
                                          None if spec is None else spec.counts())

    def _fail_everything(self, error: EngineDeadError) -> None:
        """The loop is over: every caller still waiting gets the error."""
        with self._lock:
            streams, self._streams = list(self._streams.values()), {}
        commands = drain(self._inbox)
        for stream in streams:
            stream.fail(error)
        for command in commands:
            if command[0] in ("call", "exclusive"):
                command[2].set_exception(error)
        for _, future in self._exclusive:
            future.set_exception(error)
        self._exclusive.clear()
        for request_id in list(self.engine.requests):
            try:
                self.engine.abort(request_id)  # frees the blocks, when the state allows
            except Exception:
                break


def drain(inbox: queue.SimpleQueue) -> list[tuple]:
    """Every command waiting in inbox, without blocking."""
    commands = []
    while True:
        try:
            commands.append(inbox.get_nowait())
        except queue.Empty:
            return commands


def aborted_output(prepared: PreparedRequest, request_id: str) -> RequestOutput:
    """The final output of a request aborted before it reached the engine."""
    return RequestOutput(request_id, prepared.prompt, prepared.prompt_token_ids,
                         [CompletionOutput(0, finish_reason="abort")], finished=True)
