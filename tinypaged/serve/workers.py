"""Work that would hold the event loop, run in threads: rendering a chat template,
tokenizing or detokenizing a long input, compiling a grammar. While it runs, /health
and every other client are served.

A WorkerPool runs at most `workers` jobs at once. A job waits at most `queue_timeout`
seconds for a thread (then 503: the server is busy) and then has `budget` seconds (then
400: this input costs too much). A Python thread cannot be stopped, so a job past its
budget runs on to its end in its thread, which stays taken meanwhile; the work itself
is bounded elsewhere (the template's budget, llguidance's limits, the body's size),
and large text work goes on in a child process that is killed at the budget
(text_processes.py). Grammars get a pool of their own, so a costly grammar never
delays a plain request.
"""
from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, TypeVar

from .errors import APIError, log

T = TypeVar("T")


class WorkerPool:
    def __init__(self, name: str, workers: int, budget: float, queue_timeout: float):
        self.name, self.budget, self.queue_timeout = name, budget, queue_timeout
        self._executor = ThreadPoolExecutor(workers, thread_name_prefix=f"tinypaged-{name}")

    async def run(self, job: Callable[[], T], what: str, param: str | None = None) -> T:
        """job()'s result, computed in a thread; its exceptions raised here. what: the
        work, for the errors ("compiling the grammar"); param: the field at fault."""
        loop = asyncio.get_running_loop()
        started = asyncio.Event()
        began = []

        def timed():
            began.append(time.monotonic())
            loop.call_soon_threadsafe(started.set)
            return job()

        future = loop.run_in_executor(self._executor, timed)
        try:
            await asyncio.wait_for(started.wait(), self.queue_timeout)
        except asyncio.TimeoutError:
            if future.cancel():
                raise APIError(503, f"the server is busy ({self.name} workers all taken for "
                                    f"{self.queue_timeout:g} s); retry later",
                               code="server_overloaded", headers={"Retry-After": "1"}) from None
            await started.wait()  # (it began just now)
        try:
            return await asyncio.wait_for(asyncio.shield(future), self.budget)
        except asyncio.TimeoutError:
            def finished_late(f) -> None:
                if not f.cancelled():
                    f.exception()  # (retrieved: nobody else will)
                log.info("%s ended %.1f s after its budget", what,
                         time.monotonic() - began[0] - self.budget)
            future.add_done_callback(finished_late)
            raise APIError(400, f"{what} took more than {self.budget:g} s; cut off",
                           param=param) from None

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
