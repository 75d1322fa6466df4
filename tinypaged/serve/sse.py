"""Server-sent events as OpenAI clients parse them, and noticing a client that left.

`data: {json}\\n\\n` per event, `data: [DONE]\\n\\n` at the end. When the client goes
away, the event generator is cancelled at once (not at its next write), so the
requests behind it are aborted and their blocks freed within a step.
"""
from __future__ import annotations

import asyncio
import json
from typing import Any, Awaitable

import anyio
from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

DONE = "data: [DONE]\n\n"


def event(payload: dict) -> str:
    return f"data: {json.dumps(payload, separators=(',', ':'))}\n\n"


class EventStreamResponse(StreamingResponse):
    """A text/event-stream response that always races the stream against the client's
    disconnect, whatever ASGI version the server speaks."""
    media_type = "text/event-stream"

    def __init__(self, content, **kwargs):
        super().__init__(content, headers={"Cache-Control": "no-cache"}, **kwargs)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async with anyio.create_task_group() as group:
            async def stream() -> None:
                await self.stream_response(send)
                group.cancel_scope.cancel()
            group.start_soon(stream)
            await self.listen_for_disconnect(receive)
            group.cancel_scope.cancel()


async def wait_for_disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def unless_disconnected(request: Request, work: Awaitable[Any]) -> tuple[bool, Any]:
    """Run work while watching the client: (True, result), or (False, None) if the
    client left first (work is then cancelled, which aborts its requests)."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(wait_for_disconnect(request))
    try:
        done, _ = await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
    if task in done:
        return True, task.result()
    try:
        await task
    except (asyncio.CancelledError, Exception):  # nobody is left to tell
        pass
    return False, None
