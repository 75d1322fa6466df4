"""POST /v1/completions: one prompt or a batch, n samples each, streamed or not, with
echo and logprobs (the echoed prompt's own logprobs too)."""
from __future__ import annotations

import asyncio
import time
import uuid
from typing import AsyncIterator

from fastapi import Request
from fastapi.responses import Response

from ..outputs import RequestOutput
from .engine_client import PARAM_IN_MESSAGE, EngineClient, RequestLog
from .errors import APIError, error_body
from .json_body import json_built_off_the_loop
from .openai_format import (ChoiceDelta, TextOffsets, completion_choice, completion_logprobs,
                            echo_offsets, envelope, usage, vllm_prompt_logprobs)
from .protocol import CompletionRequest
from .sse import DONE, EventStreamResponse, event, unless_disconnected


def check_common(req, client: EngineClient) -> None:
    """What both endpoints refuse before any work."""
    client.check_model(req.model)
    if req.stream_options is not None and not req.stream:
        raise APIError(400, "stream_options is only allowed when stream is true",
                       param="stream_options")


def build_params(req, max_tokens: int | None, **logprobs):
    try:
        return req.sampling_params(max_tokens or 1, **logprobs)  # max_tokens set per prompt
    except (ValueError, TypeError) as e:
        match = PARAM_IN_MESSAGE.match(str(e))
        raise APIError(400, str(e), param=match.group(1) if match else None) from None


async def create_completion(req: CompletionRequest, request: Request,
                            client: EngineClient) -> Response:
    check_common(req, client)
    started = time.monotonic()
    if req.best_of is not None and req.best_of != req.n:
        raise APIError(400, "best_of other than n is not supported", param="best_of")
    if req.suffix:
        raise APIError(400, "suffix is not supported", param="suffix")
    prompts = req.prompts()
    if req.prompt_logprobs is not None and req.stream:
        raise APIError(400, "prompt_logprobs is not supported with stream", param="prompt_logprobs")
    wanted = [k for k in (req.logprobs if req.echo else None, req.prompt_logprobs) if k is not None]
    params = await client.text_work.run(lambda: build_params(
        req, req.max_tokens, logprobs=req.logprobs,
        prompt_logprobs=max(wanted) if wanted else None), "reading the constraint")
    constraint_param = req.constraint_field()  # (one at most: build_params checked)
    prepared = await client.prepare_all(prompts, params, req.max_tokens, "prompt",
                                        constraint_param)
    client.check_logprob_entries(prepared, req.echo, "logprobs")
    tokenizer = client.llm.tokenizer
    echoes = [""] * len(prepared)
    if req.echo:
        echoes = await client.text_work.run(lambda: [
            p.prompt if p.prompt is not None else client.text.decode(p.prompt_token_ids)
            for p in prepared], "decoding the echoed prompts", "prompt")
    response_id, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())
    record = RequestLog(f"{request.state.request_id} {response_id}", started,
                        constraint_param)
    handles = client.submit(prepared, response_id, client.check_model(req.model))

    def offsets_for(i: int) -> TextOffsets:
        """text_offset of prompt i's generated tokens, which follow its echo."""
        return TextOffsets(tokenizer, prepared[i].prompt_token_ids, len(echoes[i]))

    def logprobs_of(i: int, out: RequestOutput, token_ids, entries, offsets: TextOffsets,
                    with_prompt: bool):
        """The logprobs object for these generated tokens (after the echoed prompt's, if
        with_prompt); offsets follows the choice's generated text."""
        if req.logprobs is None:
            return None
        positions = offsets.of(token_ids)
        if with_prompt:
            positions = echo_offsets(tokenizer, out.prompt_token_ids, echoes[i]) + positions
            token_ids, entries = out.prompt_token_ids + token_ids, out.prompt_token_logprobs + entries
        return completion_logprobs(tokenizer, token_ids, entries, positions)

    if req.stream:
        return EventStreamResponse(stream_completion(req, client, handles, record, response_id,
                                                     created, echoes, offsets_for, logprobs_of))
    ok, outputs = await unless_disconnected(request, client.results(handles, record))
    if not ok:
        record.left()
        return Response(status_code=499)  # the client left; nobody reads this

    def body() -> dict:
        choices = [completion_choice(i * req.n + o.index, echoes[i] + o.text,
                                     logprobs_of(i, out, o.token_ids, o.token_logprobs or [],
                                                 offsets_for(i), req.echo),
                                     o.finish_reason)
                   for i, out in enumerate(outputs) for o in out.outputs]
        if req.prompt_logprobs is not None:  # vLLM's form, in every choice of the prompt
            for choice in choices:
                choice["prompt_logprobs"] = vllm_prompt_logprobs(
                    outputs[choice["index"] // req.n], req.prompt_logprobs)
        return envelope("text_completion", response_id, created, client.served_name(req.model), choices,
                        usage=usage(outputs))
    return await json_built_off_the_loop(body)


async def stream_completion(req: CompletionRequest, client: EngineClient, handles,
                            record: RequestLog, response_id: str, created: int, echoes: list[str],
                            offsets_for, logprobs_of) -> AsyncIterator[str]:
    include_usage = req.stream_options is not None and req.stream_options.include_usage
    extra = {"usage": None} if include_usage else {}
    deltas: dict[tuple[int, int], ChoiceDelta] = {}
    offsets: dict[tuple[int, int], TextOffsets] = {}  # per choice (text_offset)
    final: dict[int, RequestOutput] = {}
    try:
        async for i, out in client.updates(handles):
            final[i] = out
            for o in out.outputs:
                key = (i, o.index)
                first = key not in deltas
                taken = deltas.setdefault(key, ChoiceDelta()).take(o)
                if taken is None:
                    continue
                text, ids, entries, finish = taken
                echo = req.echo and first
                if first:
                    offsets[key] = offsets_for(i)
                logprobs = logprobs_of(i, out, ids, entries, offsets[key], echo)
                text = (echoes[i] if echo else "") + text
                choice = completion_choice(i * req.n + o.index, text, logprobs, finish)
                yield event(envelope("text_completion", response_id, created, client.served_name(req.model),
                                     [choice], **extra))
        if include_usage:
            yield event(envelope("text_completion", response_id, created, client.served_name(req.model), [],
                                 usage=usage([final[i] for i in sorted(final)])))
    except (asyncio.CancelledError, GeneratorExit):  # the client left
        record.left()
        raise
    except Exception as e:  # a request failed mid-stream: say so in the stream
        failure = record.failed(e)
        yield event(error_body(failure.status, failure.message))
    else:
        record.finished([final[i] for i in sorted(final)])
    yield DONE
