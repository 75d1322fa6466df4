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
from . import tool_output, tool_prompt, tools
from .openai_format import ChoiceDelta, chat_choice, chat_delta_choice, chat_logprobs, envelope, usage
from .protocol import ChatCompletionRequest
from .sse import DONE, EventStreamResponse, event, unless_disconnected


async def create_chat_completion(req: ChatCompletionRequest, request: Request,
                                 client: EngineClient) -> Response:
    check_common(req, client)
    started = time.monotonic()
    if req.top_logprobs is not None and not req.logprobs:
        raise APIError(400, "top_logprobs needs logprobs: true", param="top_logprobs")
    prompt, params, max_tokens, constraint_param, tool_plan = await client.text_work.run(
        lambda: render(req, client), "rendering the chat template", "messages")
    prepared = await client.prepare_all([prompt], params, max_tokens, "messages", constraint_param)
    client.check_logprob_entries(prepared, False, "top_logprobs")
    response_id, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
    record = RequestLog(f"{request.state.request_id} {response_id}", started, constraint_param)
    handles = client.submit(prepared, response_id, client.check_model(req.model))
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
        return envelope("chat.completion", response_id, created, client.served_name(req.model), choices,
                        usage=usage(outputs))
    return await json_built_off_the_loop(body)


def render(req: ChatCompletionRequest, client: EngineClient):
    """(prompt token ids, SamplingParams, max_tokens, the constraint's field, ToolPlan or
    None) of a chat request: its tools planned, its conversation rendered by the chat
    template and tokenized (in a worker thread: a template or a long conversation can
    take a while)."""
    tokenizer = client.llm.tokenizer
    max_tokens = req.requested_max_tokens()
    params = build_params(req, max_tokens, logprobs=(req.top_logprobs or 0) if req.logprobs else None)
    constraint_param = req.constraint_field()
    tool_dicts = [t.model_dump(exclude_none=True) for t in req.tools] if req.tools else None
    choice = req.tool_choice.model_dump() if hasattr(req.tool_choice, "model_dump") \
        else req.tool_choice
    reply_schema = None
    if tool_dicts and choice != "none":
        reply_schema = reply_schema_of(params.structured_outputs, constraint_param)
    parallel = req.parallel_tool_calls
    if parallel is None:
        parallel = tools.shows_parallel_calls(tokenizer.chat_template)
    try:
        tool_plan = tools.plan(tool_dicts, choice, tokenizer.chat_template,
                               tokenizer.special_tokens, parallel, reply_schema)
    except (ValueError, TypeError) as e:
        raise APIError(400, f"tools: {e}", param="tools") from None
    if tool_plan is not None:
        params.structured_outputs, constraint_param = tool_plan.constraint, "tools"
        if tool_plan.skip_special_tokens is not None:
            params.skip_special_tokens = tool_plan.skip_special_tokens
    messages = tool_prompt.conversation(req.chat_messages(), tool_dicts, tool_plan,
                                        choice == "required", parallel,
                                        reply_schema, tokenizer.chat_template or "")
    try:
        prompt = client.text.chat_ids(
            messages, tools=tools.template_tools(tool_dicts, choice, tokenizer.chat_template),
            max_model_len=client.llm.max_model_len)
    except (ValueError, TypeError) as e:
        raise APIError(400, str(e), param="messages") from None
    return prompt, params, max_tokens, constraint_param, tool_plan


def reply_schema_of(constraint, field: str | None) -> dict | None:
    """The JSON schema a text reply beside tool calls follows: the request's own
    constraint where it is one (response_format, structured_outputs' json, ...)."""
    if constraint is None:
        return None
    if constraint.kind == "json":
        return constraint.json
    if constraint.kind == "json_object":
        return {"type": "object"}
    raise APIError(400, f"{field} and tools: a text reply beside tool calls can follow a JSON "
                        f"schema (response_format), not a {constraint.kind}", param=field)


def answer(sample, tool_plan) -> tuple[str | None, list[dict] | None, str | None]:
    """(content, tool_calls, finish reason) of a sample: under tools, its reply and calls
    read back (tool_output.py)."""
    if tool_plan is None:
        return sample.text, None, sample.finish_reason
    content, calls, finish = tool_output.answer(sample.text, sample.finish_reason, tool_plan)
    return content, calls or None, finish


async def stream_chat(req: ChatCompletionRequest, client: EngineClient, handles, record: RequestLog,
                      response_id: str, created: int, logprobs_of, tool_plan) -> AsyncIterator[str]:
    """Content deltas as they come; under tools, the reply's text and each call's name
    and growing arguments as OpenAI's tool_calls deltas (tool_output.ToolStream)."""
    include_usage = req.stream_options is not None and req.stream_options.include_usage
    extra = {"usage": None} if include_usage else {}

    def chunk(index: int, delta: dict, entries=None, finish=None) -> str:
        choice = chat_delta_choice(index, delta, logprobs_of(entries) if entries else None, finish)
        return event(envelope("chat.completion.chunk", response_id, created, client.served_name(req.model),
                              [choice], **extra))

    deltas: dict[int, ChoiceDelta] = {}
    tool_streams: dict[int, tool_output.ToolStream] = {}
    last = None
    try:
        async for _, out in client.updates(handles):
            last = out
            for o in out.outputs:
                if o.index not in deltas:  # the role opens every choice
                    deltas[o.index] = ChoiceDelta()
                    tool_streams[o.index] = tool_output.ToolStream(tool_plan) if tool_plan else None
                    yield chunk(o.index, {"role": "assistant", "content": ""})
                taken = deltas[o.index].take(o)
                if taken is None:
                    continue
                text, ids, entries, finish = taken
                stream = tool_streams[o.index]
                if stream is not None:
                    for delta in stream.deltas(o.text, finish is not None):
                        yield chunk(o.index, delta, entries)
                        entries = None  # the logprobs ride on the first delta
                    if finish == "stop" and stream.called:
                        finish = "tool_calls"
                elif text or ids:
                    yield chunk(o.index, {"content": text}, entries)
                    entries = None
                if finish is not None:
                    yield chunk(o.index, {}, entries, finish)
        if include_usage:
            yield event(envelope("chat.completion.chunk", response_id, created, client.served_name(req.model),
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
