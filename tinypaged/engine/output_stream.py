"""RequestStream: one request's outputs, handed from the engine loop's thread to the
one caller waiting for them, a thread or an asyncio task.

Outputs are cumulative snapshots (the whole text so far), so a consumer that falls
behind skips to the newest one: nothing queues up, and the loop never waits for a
consumer.
"""
from __future__ import annotations

import asyncio
import threading
import time
from typing import AsyncIterator, Iterator

from ..outputs import RequestOutput


class RequestStream:
    def __init__(self, request_id: str):
        self.request_id = request_id
        self.arrival = time.monotonic()
        self._cond = threading.Condition()
        self._output: RequestOutput | None = None
        self._version = 0  # bumped by every put()
        self._error: BaseException | None = None
        self._closed = False  # finished, failed or aborted: no more outputs
        self._async_waiter: tuple[asyncio.AbstractEventLoop, asyncio.Event] | None = None
        # latency bookkeeping, written by the loop thread only (see LoopMetrics)
        self.first_token_time: float | None = None
        self.last_token_time: float | None = None
        self.num_tokens_seen = 0

    # -- the engine loop's side ------------------------------------------------
    def put(self, output: RequestOutput) -> None:
        with self._cond:
            self._output, self._version = output, self._version + 1
            self._closed = output.finished
            self._wake_locked()

    def fail(self, error: BaseException) -> None:
        with self._cond:
            self._error, self._closed = error, True
            self._wake_locked()

    def _wake_locked(self) -> None:
        self._cond.notify_all()
        if self._async_waiter is not None:
            loop, event = self._async_waiter
            try:
                loop.call_soon_threadsafe(event.set)
            except RuntimeError:  # that event loop is closed: nobody waits there any more
                pass

    # -- the consumer's side ---------------------------------------------------
    def _take_locked(self, seen: int) -> tuple[int, RequestOutput] | None:
        """The newest output if newer than version `seen`; raises the failure."""
        if self._version > seen:
            return self._version, self._output
        if self._error is not None:
            raise self._error
        if self._closed:
            raise RuntimeError(f"request {self.request_id} ended without a final output")
        return None

    def updates(self) -> Iterator[RequestOutput]:
        """Snapshots until the finished one, blocking the calling thread in between."""
        seen = 0
        while True:
            with self._cond:
                taken = self._take_locked(seen)
                while taken is None:
                    self._cond.wait()
                    taken = self._take_locked(seen)
            seen, output = taken
            yield output
            if output.finished:
                return

    async def async_updates(self) -> AsyncIterator[RequestOutput]:
        """Snapshots until the finished one, without blocking the event loop."""
        loop, seen = asyncio.get_running_loop(), 0
        while True:
            with self._cond:
                taken = self._take_locked(seen)
                if taken is None:
                    if self._async_waiter is None or self._async_waiter[0] is not loop:
                        self._async_waiter = (loop, asyncio.Event())
                    event = self._async_waiter[1]
                    event.clear()  # under the lock: a put() after this sets it again
            if taken is None:
                await event.wait()
                continue
            seen, output = taken
            yield output
            if output.finished:
                return
