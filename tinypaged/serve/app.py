"""The FastAPI application: routes, the API-key and body-size guard, error handlers.

Routes: POST /v1/completions, POST /v1/chat/completions, POST /v1/embeddings,
POST /v1/rerank, POST /v1/load_lora_adapter, POST /v1/unload_lora_adapter, GET /v1/models
(the model and its LoRA adapters), GET /v1/models/{model}, GET /health, GET /metrics (and
FastAPI's /docs).
"""
from __future__ import annotations

import hmac
import json
import threading
import time
import uuid

import anyio
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Receive, Scope, Send

from .. import __version__
from ..llm import LLM
from . import metrics
from .chat import create_chat_completion
from .completions import create_completion
from .embeddings import EmbeddingRequest, create_embeddings
from .lora import (LoadLoRAAdapterRequest, UnloadLoRAAdapterRequest, adapter_cards,
                   load_adapter, unload_adapter)
from .rerank import RerankRequest, create_rerank
from .config import ServerConfig
from .engine_client import EngineClient
from .errors import cut, error_body, install_error_handlers, log
from .json_body import json_response
from .protocol import ChatCompletionRequest, CompletionRequest
from .tokenize import DetokenizeRequest, TokenizeRequest, detokenize, tokenize


REQUEST_ID_CHARS = 128  # of a client's X-Request-Id, kept


def client_request_id(headers: dict) -> str:
    """The client's X-Request-Id (printable ASCII, cut short), or a new one."""
    given = headers.get(b"x-request-id", b"").decode("latin-1")[:REQUEST_ID_CHARS]
    return given if given and given.isprintable() and given.isascii() else uuid.uuid4().hex


class Guard:
    """Pure ASGI, in front of everything: /v1/* needs the API key when one is set
    (401), and no request body may exceed max_body_bytes (413), whether it says
    its length up front or not. Every response carries the request's X-Request-Id
    (the client's, or a new one; routes log it)."""

    def __init__(self, app: ASGIApp, api_key: str | None, max_body_bytes: int):
        self.app, self.api_key, self.max_body_bytes = app, api_key, max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope["headers"])
        request_id = client_request_id(headers)
        scope.setdefault("state", {})["request_id"] = request_id
        send = with_request_id(send, request_id, scope.get("method", ""), scope.get("path", ""))
        if self.api_key and scope["path"].startswith("/v1"):
            # bytes against bytes: any header (and any key) compares, in constant time
            given = headers.get(b"authorization", b"")
            if not hmac.compare_digest(given, b"Bearer " + self.api_key.encode("utf-8")):
                response = JSONResponse(error_body(401, "invalid or missing API key (send "
                                                        "'Authorization: Bearer <key>')",
                                                   code="invalid_api_key"),
                                        status_code=401, headers={"WWW-Authenticate": "Bearer"})
                return await response(scope, receive, send)
        length = headers.get(b"content-length", b"0")
        if length.isdigit() and int(length) > self.max_body_bytes:
            return await self._too_large()(scope, receive, send)
        received = 0

        async def limited_receive():
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_body_bytes:  # FastAPI re-raises this one as is
                    raise HTTPException(413, self._too_large_message())
            return message
        await self.app(scope, limited_receive, send)

    def _too_large_message(self) -> str:
        return f"the request body is over {self.max_body_bytes} bytes"

    def _too_large(self) -> JSONResponse:
        return JSONResponse(error_body(413, self._too_large_message()), status_code=413)


async def read_body(request: Request, model: type[BaseModel], limits: dict) -> BaseModel:
    """The request's JSON body as model, whatever Content-Type it says (curl -d sends
    form-urlencoded), parsed and checked in a worker thread: a body of megabytes
    costs tens of milliseconds, which the event loop (every other client, /health)
    does not wait for. limits reach the validators (a batch of prompts is counted
    before any of them is read)."""
    raw = await request.body()
    try:
        body = await anyio.to_thread.run_sync(
            lambda: model.model_validate_json(raw, context=limits))
    except ValidationError as e:
        raise RequestValidationError(e.errors(include_url=False)) from None
    if body.model_extra:
        log.debug("request %s: ignored fields %s", request.state.request_id,
                  ", ".join(sorted(body.model_extra)))
    return body


SCHEMA_REF = "#/components/schemas/{model}"


def body_schema(model: type[BaseModel]) -> dict:
    """The OpenAPI request body of a route that reads its body itself (read_body);
    the schemas go in with add_body_schemas."""
    return {"requestBody": {"required": True, "content": {
        "application/json": {"schema": {"$ref": SCHEMA_REF.format(model=model.__name__)}}}}}


def add_body_schemas(app: FastAPI, models: list[type[BaseModel]]) -> None:
    """Put models' JSON schemas (and those they use) among the OpenAPI components."""
    make_openapi = app.openapi

    def openapi() -> dict:
        if app.openapi_schema is None:
            schema = make_openapi()
            components = schema.setdefault("components", {}).setdefault("schemas", {})
            for model in models:
                body = model.model_json_schema(ref_template=SCHEMA_REF)
                components.update(body.pop("$defs", {}))
                components[model.__name__] = body
        return app.openapi_schema
    app.openapi = openapi


def with_request_id(send: Send, request_id: str, method: str, path: str) -> Send:
    """send, with the X-Request-Id header on the response, and a refusal (a 4xx) logged
    as one line: the request id, the route, the status and the error's message."""
    status = None

    async def send_with_id(message) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
            message = {**message, "headers": [*message.get("headers", ()),
                                              (b"x-request-id", request_id.encode())]}
        elif message["type"] == "http.response.body" and status is not None and 400 <= status < 500:
            log.warning("request %s: %s %s -> %d: %s", request_id, method, cut(path), status,
                        refusal_reason(message.get("body", b"")))
            status = None  # (once, whatever the body's chunks)
        await send(message)
    return send_with_id


def refusal_reason(body: bytes) -> str:
    """The message of an error body (errors.error_body's shape), on one line."""
    try:
        message = json.loads(body)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        message = body[:200].decode("utf-8", errors="replace")
    return " ".join(str(message).split())


def build_app(llm: LLM, config: ServerConfig, ready: threading.Event | None = None) -> FastAPI:
    """The routes over llm; /health says 503 "loading" until `ready` is set (the warm-up's
    end: warmup.py; None: ready at once)."""
    client = EngineClient(llm, config)
    started = int(time.time())
    app = FastAPI(title="tinypaged", version=__version__,
                  description="An OpenAI-compatible server over the tinypaged engine.")
    app.state.engine_client = client  # (the server closes its workers at the end)
    install_error_handlers(app)
    app.add_middleware(Guard, api_key=config.api_key, max_body_bytes=config.max_body_bytes)

    limits = {"max_prompts": config.max_prompts_per_request}

    @app.post("/v1/completions", openapi_extra=body_schema(CompletionRequest))
    async def completions(request: Request):
        body = await read_body(request, CompletionRequest, limits)
        return await create_completion(body, request, client)

    @app.post("/v1/chat/completions", openapi_extra=body_schema(ChatCompletionRequest))
    async def chat_completions(request: Request):
        body = await read_body(request, ChatCompletionRequest, limits)
        return await create_chat_completion(body, request, client)

    @app.post("/v1/embeddings", openapi_extra=body_schema(EmbeddingRequest))
    async def embeddings(request: Request):
        body = await read_body(request, EmbeddingRequest, limits)
        return await create_embeddings(body, client)

    @app.post("/v1/rerank", openapi_extra=body_schema(RerankRequest))
    @app.post("/rerank", include_in_schema=False)
    async def rerank(request: Request):
        body = await read_body(request, RerankRequest, limits)
        return await create_rerank(body, client)

    @app.post("/tokenize", openapi_extra=body_schema(TokenizeRequest))
    async def tokenize_route(request: Request):
        body = await read_body(request, TokenizeRequest, limits)
        return await client.text_work.run(lambda: json_response(tokenize(body, client)),
                                          "tokenizing",
                                          "prompt" if body.prompt is not None else "messages")

    @app.post("/detokenize", openapi_extra=body_schema(DetokenizeRequest))
    async def detokenize_route(request: Request):
        body = await read_body(request, DetokenizeRequest, limits)
        return await client.text_work.run(lambda: json_response(detokenize(body, client)),
                                          "detokenizing", "tokens")

    @app.post("/v1/load_lora_adapter", openapi_extra=body_schema(LoadLoRAAdapterRequest))
    async def load_lora_adapter(request: Request):
        return await load_adapter(await read_body(request, LoadLoRAAdapterRequest, limits), client)

    @app.post("/v1/unload_lora_adapter", openapi_extra=body_schema(UnloadLoRAAdapterRequest))
    async def unload_lora_adapter(request: Request):
        return await unload_adapter(await read_body(request, UnloadLoRAAdapterRequest, limits), client)

    add_body_schemas(app, [CompletionRequest, ChatCompletionRequest, EmbeddingRequest,
                           RerankRequest, TokenizeRequest, DetokenizeRequest,
                           LoadLoRAAdapterRequest, UnloadLoRAAdapterRequest])

    def model_card() -> dict:
        return {"id": client.model_name, "object": "model", "created": started,
                "owned_by": "tinypaged", "max_model_len": llm.max_model_len}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [model_card(), *adapter_cards(client, started)]}

    @app.get("/v1/models/{model:path}")
    async def model(model: str):
        if client.check_model(model) is not None:
            return next(c for c in adapter_cards(client, started) if c["id"] == model)
        return model_card()

    @app.head("/health", include_in_schema=False)  # load balancers' probes
    @app.get("/health")
    async def health():
        if not llm.is_alive:
            return JSONResponse({"status": "engine stopped"}, status_code=503)
        if ready is not None and not ready.is_set():
            return JSONResponse({"status": "loading"}, status_code=503)
        return {"status": "ok"}

    @app.get("/metrics")
    async def prometheus():
        return PlainTextResponse(metrics.render(llm.metrics(), client.model_name),
                                 media_type=metrics.CONTENT_TYPE)

    return app
