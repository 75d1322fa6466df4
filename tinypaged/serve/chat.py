"""POST /v1/chat/completions: the conversation through the model's chat template, n
samples, streamed as chat.completion.chunk events (role first, then content, then
the finish reason) or returned whole."""
from __future__ import annotations

import asyncio
import time
import uuid
from typing import AsyncIterator

from fastapi import Request
from fastapi.responses import Response

from .completions import build_params, check_common
from .engine_client import EngineClient, RequestLog
from .errors import APIError, error_body
from .json_body import json_built_off_the_loop
from . import tools
from .openai_format import ChoiceDelta, chat_choice, chat_delta_choice, chat_logprobs, envelope, usage
from .protocol import ChatCompletionRequest
from .sse import DONE, EventStreamResponse, event, unless_disconnected


async def create_chat_completion(req: ChatCompletionRequest, request: Request,
                                 client: EngineClient) -> Response:
    check_common(req, client)
    started = time.monotonic()
    if req.top_logprobs is not None and not req.logprobs:
        raise APIError(400, "top_logprobs needs logprobs: true", param="top_logprobs")
    tokenizer = client.llm.tokenizer
    tool_dicts = [t.model_dump(exclude_none=True) for t in req.tools] if req.tools else None
    choice = req.tool_choice.model_dump() if hasattr(req.tool_choice, "model_dump") \
        else req.tool_choice
    tool_plan = tools.plan(tool_dicts, choice, tokenizer.chat_template, tokenizer.special_tokens)
    try:
        prompt = client.llm.chat_prompt_ids(req.chat_messages(),
                                            tools.template_tools(tool_dicts, choice))
    except (ValueError, TypeError) as e:
        raise APIError(400, str(e), param="messages") from None
    max_tokens = req.requested_max_tokens()
    params = build_params(req, max_tokens, logprobs=(req.top_logprobs or 0) if req.logprobs else None)
    constraint_param = req.constraint_field()
    if tool_plan is not None:
        if params.structured_outputs is not None:
            raise APIError(400, f"{constraint_param} and tools: give one constraint, not both",
                           param=constraint_param)
        params.structured_outputs, constraint_param = tool_plan.constraint, "tools"
    prepared = [client.prepare(prompt, params, max_tokens, "messages", constraint_param)]
    client.check_logprob_entries(prepared, False, "top_logprobs")
    response_id, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
    record = RequestLog(f"{request.state.request_id} {response_id}", started)
    handles = client.submit(prepared, response_id)
    tokenizer = client.llm.tokenizer

    def logprobs_of(entries):
        return chat_logprobs(tokenizer, entries) if req.logprobs else None

    if req.stream:
        return EventStreamResponse(stream_chat(req, client, handles, record, response_id, created,
                                               logprobs_of, tool_plan))
    ok, outputs = await unless_disconnected(request, client.results(handles, record))
    if not ok:
        record.left()
        return Response(status_code=499)  # the client left; nobody reads this

    def body() -> dict:
        choices = [chat_choice(o.index, *answer(o, tool_plan), logprobs_of(o.token_logprobs or []))
                   for o in outputs[0].outputs]
        return envelope("chat.completion", response_id, created, client.model_name, choices,
                        usage=usage(outputs))
    return await json_built_off_the_loop(body)


def answer(sample, tool_plan) -> tuple[str | None, list[dict] | None, str | None]:
    """(content, tool_calls, finish reason) of a sample: under tools, its calls parsed
    out (finish_reason "tool_calls"); a sample cut short stays text."""
    if tool_plan is None or sample.finish_reason != "stop":
        return sample.text, None, sample.finish_reason
    content, calls = tools.parse(sample.text, tool_plan)
    return (content, calls, "tool_calls") if calls else (sample.text, None, "stop")


async def stream_chat(req: ChatCompletionRequest, client: EngineClient, handles, record: RequestLog,
                      response_id: str, created: int, logprobs_of, tool_plan) -> AsyncIterator[str]:
    """Content deltas as they come; under tools, the whole answer at the end (a call's
    JSON is only parsed once complete), its calls as OpenAI's tool_calls deltas."""
    include_usage = req.stream_options is not None and req.stream_options.include_usage
    extra = {"usage": None} if include_usage else {}

    def chunk(choice: dict) -> str:
        return event(envelope("chat.completion.chunk", response_id, created, client.model_name,
                              [choice], **extra))

    deltas: dict[int, ChoiceDelta] = {}
    last = None
    try:
        async for _, out in client.updates(handles):
            last = out
            for o in out.outputs:
                if o.index not in deltas:  # the role opens every choice
                    deltas[o.index] = ChoiceDelta()
                    yield chunk(chat_delta_choice(o.index, {"role": "assistant", "content": ""},
                                                  None, None))
                taken = deltas[o.index].take(o)
                if taken is None:
                    continue
                text, ids, entries, finish = taken
                if tool_plan is not None:
                    if finish is None:
                        continue
                    content, calls, finish = answer(o, tool_plan)
                    if content:
                        yield chunk(chat_delta_choice(o.index, {"content": content}, None, None))
                    if calls:
                        yield chunk(chat_delta_choice(o.index, {"tool_calls": [
                            {"index": i, **call} for i, call in enumerate(calls)]}, None, None))
                elif text or ids:
                    yield chunk(chat_delta_choice(o.index, {"content": text},
                                                  logprobs_of(entries), None))
                if finish is not None:
                    yield chunk(chat_delta_choice(o.index, {}, None, finish))
        if include_usage:
            yield event(envelope("chat.completion.chunk", response_id, created, client.model_name,
                                 [], usage=usage([last])))
    except (asyncio.CancelledError, GeneratorExit):  # the client left
        record.left()
        raise
    except Exception as e:  # the request failed mid-stream: say so in the stream
        failure = record.failed(e)
        yield event(error_body(failure.status, failure.message))
    else:
        record.finished([last])
    yield DONE
