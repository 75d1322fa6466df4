"""Errors in OpenAI's shape: {"error": {"message", "type", "param", "code"}}, for every
failure a client can meet (validation, unknown route, auth, size, overload, internal).
A traceback never reaches a client: it goes to the server's log."""
from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

log = logging.getLogger("tinypaged.serve")

TYPE_BY_STATUS = {400: "invalid_request_error", 401: "authentication_error",
                  404: "invalid_request_error", 405: "invalid_request_error",
                  413: "invalid_request_error", 503: "server_overloaded"}


SHOWN_CHARS = 100  # of a client's value quoted back in an error message
MAX_MESSAGE_CHARS = 400  # of any error message (what a client sent is never echoed whole)


def shown(value: str) -> str:
    """A client's value for an error message: quoted, and cut short if long."""
    return cut(repr(value), len(value))


def cut(text: str, length: int | None = None) -> str:
    """text, or its first SHOWN_CHARS characters and how long it was."""
    if len(text) <= SHOWN_CHARS:
        return text
    return f"{text[:SHOWN_CHARS]}... ({length or len(text)} characters)"


class APIError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None,
                 code: str | None = None, headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.headers = headers


def error_body(status: int, message: str, param: str | None = None, code: str | None = None) -> dict:
    if len(message) > MAX_MESSAGE_CHARS:
        message = message[:MAX_MESSAGE_CHARS] + "... (cut)"
    if param is not None and len(param) > SHOWN_CHARS:
        param = param[:SHOWN_CHARS] + "..."
    return {"error": {"message": message, "type": TYPE_BY_STATUS.get(status, "server_error"),
                      "param": param, "code": code}}


def error_response(error: APIError) -> JSONResponse:
    return JSONResponse(error_body(error.status, error.message, error.param, error.code),
                        status_code=error.status, headers=error.headers)


def validation_message(error: dict) -> tuple[str, str | None]:
    """One pydantic error -> (message, param) a client can act on."""
    loc = [cut(str(part)) for part in error.get("loc", ()) if part != "body"]
    kind = error.get("type", "")
    if kind == "json_invalid":
        return f"the body is not valid JSON ({error.get('ctx', {}).get('error', 'decode error')})", None
    if not loc:
        return f"the body must be a JSON object ({error.get('msg', 'invalid')})", None
    param = loc[0]
    if kind == "extra_forbidden":
        return f"unknown field {shown('.'.join(loc))}", param
    if kind == "missing":
        return f"{'.'.join(loc)} is required", param
    if param == "prompt" and len(loc) > 1 and kind.endswith("_type"):
        return ("prompt must be a string, a list of strings, a list of token ids or a list "
                "of lists of token ids"), param
    message = error.get("msg", "invalid value").removeprefix("Value error, ")
    return f"{'.'.join(loc)}: {message}", param


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError):
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError):
        errors = exc.errors()
        # of a union's alternatives, one that failed a bound says more than a type mismatch
        bound = [e for e in errors if e.get("type") in ("less_than_equal", "greater_than_equal")]
        message, param = validation_message((bound or errors)[0])
        return JSONResponse(error_body(400, message, param), status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException):
        path = shown(request.url.path)
        message = {404: f"no route {request.method} {path}",
                   405: f"method {request.method} is not allowed on {path}"}.get(
            exc.status_code, str(exc.detail))
        return JSONResponse(error_body(exc.status_code, message), status_code=exc.status_code,
                            headers=getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def _internal_error(request: Request, exc: Exception):
        log.exception("internal error on %s %s", request.method, request.url.path)
        return JSONResponse(error_body(500, "internal server error (see the server's log)"),
                            status_code=500)
