"""Non-streamed response bodies, built and serialized in a worker thread.

A whole answer can hold hundreds of choices with their logprobs: megabytes of
JSON, and the token texts behind them. The event loop that serves every other
client (and /health) must not stop while one such body is made.
"""
from __future__ import annotations

import json
from typing import Callable

import anyio
from fastapi.responses import Response


def encode(body: dict) -> bytes:
    """As starlette's JSONResponse renders (compact, UTF-8, no NaN)."""
    return json.dumps(body, ensure_ascii=False, allow_nan=False, indent=None,
                      separators=(",", ":")).encode("utf-8")


def json_response(body: dict) -> Response:
    """A JSON response encoded here (call it off the event loop: a /tokenize of a
    4 MB prompt answers 900,000 ids, seconds of work for FastAPI's encoder)."""
    return Response(encode(body), media_type="application/json")


async def json_built_off_the_loop(build: Callable[[], dict]) -> Response:
    """The JSON response of build(), which runs (with the encoding) in a worker thread."""
    content = await anyio.to_thread.run_sync(lambda: encode(build()))
    return Response(content, media_type="application/json")
