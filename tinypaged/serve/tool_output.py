"""An output made under a ToolPlan read back as OpenAI's message: the reply text and
the tool calls, also while it is being generated (a stream sends each call's name
once known and its arguments as they grow), and also when max_tokens cut it short.

A reading of a longer output extends the reading of a shorter one: the content and
each call's arguments only grow, so a stream sends the difference. Arguments are the
JSON text the model wrote (compact, as the grammar holds it), the same streamed or
not. The grammar made the output valid, so whatever does not parse yet is incomplete.
"""
from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass

from .tools import TAG_CLOSE, TAG_OPEN, ToolPlan

_DECODER = json.JSONDecoder()
_CALL_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*')
_ARGUMENTS_HEAD = re.compile(r'\s*,\s*"arguments"\s*:\s*')
_OBJECT_END = re.compile(r"\s*\}")
_KEY = re.compile(r'\s*\{\s*(?=")')
_COLON = re.compile(r"\s*:\s*")
_LIST_OPEN = re.compile(r"\s*:\s*\[")
_LIST_NEXT = re.compile(r"\s*(,|\])")
_TAG_CLOSED = re.compile(r"\s*" + re.escape(TAG_CLOSE))


@dataclass(slots=True)
class PartialCall:
    name: str
    arguments: str  # JSON text so far
    complete: bool


@dataclass(slots=True)
class Reading:
    content: str  # the reply text so far
    calls: list[PartialCall]


def read(text: str, plan: ToolPlan, finished: bool) -> Reading:
    """What text, an output under plan (finished: nothing more will come), says so far."""
    if plan.layout == "arguments":
        return Reading("", [PartialCall(plan.function, text, finished)])
    if plan.layout == "json":
        return _read_json_layout(text, plan.reply_is_json)
    return _read_tagged(text, finished)


def _read_json_layout(text: str, reply_is_json: bool) -> Reading:
    """{"tool_calls": [calls]} or {"response": reply}."""
    head = _KEY.match(text)
    key, end = _string(text, head.end()) if head else (None, None)
    if end is None:
        return Reading("", [])
    if key == "tool_calls":
        opened = _LIST_OPEN.match(text, end)
        return Reading("", _read_calls(text, opened.end()) if opened else [])
    colon = _COLON.match(text, end)
    if colon is None:
        return Reading("", [])
    if reply_is_json:
        value_end = _value_end(text, colon.end())
        return Reading(text[colon.end():value_end], [])
    return Reading(_string_so_far(text, colon.end()), [])


def _read_calls(text: str, i: int) -> list[PartialCall]:
    """The calls of a JSON list whose items start at i."""
    calls = []
    while True:
        call, i = _read_call(text, i)
        if call is not None:
            calls.append(call)
        if i is None:
            return calls
        sep = _LIST_NEXT.match(text, i)
        if sep is None or sep.group(1) == "]":
            return calls
        i = sep.end()


def _read_call(text: str, i: int) -> tuple[PartialCall | None, int | None]:
    """({"name": ..., "arguments": ...} at i, so far; where it ends, None if it has not)."""
    head = _CALL_HEAD.match(text, i)
    if head is None:
        return None, None
    name, end = _string(text, head.end())
    if end is None:
        return None, None
    args = _ARGUMENTS_HEAD.match(text, end)
    if args is None:
        return PartialCall(name, "", False), None
    value_end = _value_end(text, args.end())
    if value_end is None:
        return PartialCall(name, text[args.end():], False), None
    closed = _OBJECT_END.match(text, value_end)
    return PartialCall(name, text[args.end():value_end], True), closed.end() if closed else None


def _read_tagged(text: str, finished: bool) -> Reading:
    """Free text with calls in <tool_call> tags: the text outside them (its ends
    stripped) and the calls."""
    content, calls, i = [], [], 0
    while True:
        tag = text.find(TAG_OPEN, i)
        if tag < 0:
            tail = text[i:]
            content.append(tail if finished else tail[:len(tail) - _partial_tag(tail)])
            break
        content.append(text[i:tag])
        call, end = _read_call(text, tag + len(TAG_OPEN))
        if call is not None:
            calls.append(call)
        closed = _TAG_CLOSED.match(text, end) if end is not None else None
        if closed is None:
            break
        i = closed.end()
    return Reading("".join(content).strip(), calls)


def _partial_tag(text: str) -> int:
    """How many characters at text's end could be the start of a <tool_call> tag."""
    for n in range(min(len(TAG_OPEN) - 1, len(text)), 0, -1):
        if TAG_OPEN.startswith(text[-n:]):
            return n
    return 0


def _string(text: str, i: int) -> tuple[str | None, int | None]:
    """(the JSON string at i, where it ends), or (None, None) while it is incomplete."""
    end = _value_end(text, i)
    if end is None or not text.startswith('"', i):
        return None, None
    return json.loads(text[i:end]), end


def _string_so_far(text: str, i: int) -> str:
    """The JSON string at i decoded as far as it goes: an escape cut in half (at most
    12 characters, a surrogate pair) and half a surrogate pair wait for the rest."""
    end = _value_end(text, i)
    if end is not None:
        value = json.loads(text[i:end])
        return value if isinstance(value, str) else ""
    body = text[i + 1:]
    for cut in range(min(len(body), 12) + 1):
        try:
            value = json.loads('"' + body[:len(body) - cut] + '"')
        except json.JSONDecodeError:
            continue
        return value[:-1] if value and "\ud800" <= value[-1] <= "\udbff" else value
    return ""


def _value_end(text: str, i: int) -> int | None:
    """Where the JSON value at i ends, or None while it is incomplete (a number or a
    literal counts as complete only once something follows it)."""
    try:
        _, end = _DECODER.raw_decode(text, i)
    except (json.JSONDecodeError, IndexError):
        return None
    if end == len(text) and text[i] not in '{["':
        return None
    return end


def tool_call(call: PartialCall, call_id: str | None = None) -> dict:
    return {"id": call_id or new_call_id(), "type": "function",
            "function": {"name": call.name, "arguments": call.arguments}}


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def answer(text: str, finish_reason: str | None, plan: ToolPlan) -> tuple[str | None, list[dict], str | None]:
    """(content, tool_calls, finish reason) of a finished output: "tool_calls" where it
    ended with calls; a call cut by max_tokens is still a call (finish "length")."""
    reading = read(text, plan, True)
    calls = [tool_call(c) for c in reading.calls]
    if calls and finish_reason == "stop":
        finish_reason = "tool_calls"
    return reading.content or None, calls, finish_reason


class ToolStream:
    """What one choice has sent of its reading: each update's new content and call
    deltas, in OpenAI's chat.completion.chunk form."""

    def __init__(self, plan: ToolPlan):
        self.plan = plan
        self.content_sent = 0
        self.call_ids: list[str] = []
        self.arguments_sent: list[int] = []

    def deltas(self, text: str, finished: bool) -> list[dict]:
        reading = read(text, self.plan, finished)
        out = []
        if len(reading.content) > self.content_sent:
            out.append({"content": reading.content[self.content_sent:]})
            self.content_sent = len(reading.content)
        calls = []
        for i, call in enumerate(reading.calls):
            if i == len(self.call_ids):  # a new call: its id and name, once
                self.call_ids.append(new_call_id())
                self.arguments_sent.append(0)
                calls.append({"index": i, "id": self.call_ids[i], "type": "function",
                              "function": {"name": call.name,
                                           "arguments": call.arguments}})
            elif len(call.arguments) > self.arguments_sent[i]:
                calls.append({"index": i, "function": {
                    "arguments": call.arguments[self.arguments_sent[i]:]}})
            self.arguments_sent[i] = len(call.arguments)
        if calls:
            out.append({"tool_calls": calls})
        return out

    @property
    def called(self) -> bool:
        return bool(self.call_ids)
