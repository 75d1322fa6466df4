"""RequestHandle: a caller's grip on one submitted request, from a thread or asyncio."""
from __future__ import annotations

from typing import AsyncIterator, Iterator

from .engine.engine_loop import EngineLoop
from .interrupts import finalize_keeping_interrupts
from .engine.output_stream import RequestStream
from .outputs import RequestOutput


class RequestHandle:
    """Iterate it (`for`, or `async for`) for output snapshots, each holding the whole
    text so far, or wait for the final one with result() / aresult(). Stopping early
    (break, close, an exception, a cancelled task, or dropping the handle) aborts the
    request, and the loop frees its blocks before the next step."""

    def __init__(self, loop: EngineLoop, stream: RequestStream):
        self._loop, self._stream = loop, stream
        self._finished = False

    @property
    def request_id(self) -> str:
        return self._stream.request_id

    def __iter__(self) -> Iterator[RequestOutput]:
        try:
            for out in self._stream.updates():
                self._finished = out.finished
                yield out
        except GeneratorExit:  # closed early: a break, close(), or the collector
            finalize_keeping_interrupts(self._abort_unfinished)
            raise
        except BaseException:  # an error, or an interrupt while waiting: abort, tell the caller
            self._abort_unfinished()
            raise

    async def __aiter__(self) -> AsyncIterator[RequestOutput]:
        try:
            async for out in self._stream.async_updates():
                self._finished = out.finished
                yield out
        finally:
            self._abort_unfinished()

    def result(self) -> RequestOutput:
        """Block until the request finishes; raises what failed it."""
        out = None
        for out in self:
            pass
        return out

    async def aresult(self) -> RequestOutput:
        out = None
        async for out in self:
            pass
        return out

    def abort(self) -> None:
        self._loop.abort(self.request_id)

    def _abort_unfinished(self) -> None:
        """Post the abort (once) unless the request finished; never waits."""
        if not self._finished:
            self._loop.abort(self.request_id)
            self._finished = True  # (after: an interrupt between the two posts it again)

    def __del__(self):
        finalize_keeping_interrupts(self._abort_unfinished)


def text_deltas(handle: RequestHandle) -> Iterator[str]:
    """The new text of sample 0 at each output (never half a UTF-8 character)."""
    sent = 0
    for out in handle:
        text = out.outputs[0].text
        if len(text) > sent:
            yield text[sent:]
            sent = len(text)


async def async_text_deltas(handle: RequestHandle) -> AsyncIterator[str]:
    sent = 0
    async for out in handle:
        text = out.outputs[0].text
        if len(text) > sent:
            yield text[sent:]
            sent = len(text)
