"""Tool calls: OpenAI's `tools`, `tool_choice` and `parallel_tool_calls` turned into a
constraint on the output (a ToolPlan); tool_output.py reads the output back.

The output's layout depends on the chat template:
- "tagged": the template declares Qwen's and Hermes' `<tool_call>` tags. The tools go
  to the template, which describes them as the model was trained to read them. With
  tool_choice "auto" the output is free text in which a `<tool_call>` tag, once
  opened, holds one valid call (llguidance's lazy trigger); "required" is calls only.
- "json", any other template: the server describes the tools in a system message
  (tool_prompt.py) and the whole output is one JSON object, {"tool_calls": [{"name",
  "arguments"}, ...]} or {"response": <the reply>}, as llama.cpp's generic format.
- "arguments": a named function; the output is its arguments object, any template.

parallel_tool_calls true allows several calls; false exactly one. Unset, it is what
the chat template shows (as llama.cpp reads a template's capabilities): several where
the template writes two calls of one assistant turn, else one, since a model trained on
a template without them tends to repeat one call until max_tokens. A text reply
follows the request's JSON schema (response_format and its kin) where one is given
beside the tools.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache

from ..chat_template import render
from ..structured import StructuredOutputs
from ..structured.closed import closed_objects
from ..structured.embed import embedded
from ..structured.limits import check_optional_properties
from ..structured.params import JSON_LAYOUT
from .errors import APIError, shown

TAG_OPEN, TAG_CLOSE = "<tool_call>", "</tool_call>"


@dataclass(slots=True)
class ToolPlan:
    layout: str  # "tagged", "json" or "arguments" (above)
    constraint: StructuredOutputs
    function: str | None = None  # "arguments": the named function
    reply_is_json: bool = False  # "json": the reply is a JSON value, not a string
    skip_special_tokens: bool | None = None  # False where the tags are special tokens


@lru_cache(maxsize=16)
def shows_parallel_calls(chat_template: str | None) -> bool:
    """Whether the template writes both of two tool calls in one assistant turn (their
    arguments as a dict, as transformers hands them, else as JSON text). The probe's
    tool is named apart from its calls, so that its description does not count."""
    if not chat_template:
        return False
    probe_tools = [{"type": "function", "function": {"name": "probe_tool", "parameters": {}}}]
    for arguments in ({"x": 1}, '{"x": 1}'):
        calls = [{"id": f"call_{i}", "type": "function",
                  "function": {"name": f"probe_call_{i}", "arguments": arguments}} for i in (1, 2)]
        messages = [{"role": "user", "content": "x"},
                    {"role": "assistant", "content": "", "tool_calls": calls}]
        try:
            text = render(chat_template, messages, False, tools=probe_tools)
        except Exception:  # (a template that refuses the probe: TemplateError, or its own)
            continue
        if "probe_call_1" in text and "probe_call_2" in text:
            return True
    return False


def declares_tool_calls(chat_template: str | None) -> bool:
    """Whether the template writes tool calls in <tool_call> tags (the tagged layout)."""
    return bool(chat_template) and TAG_OPEN in chat_template


def parameters(tool: dict) -> dict:
    """A tool's parameters schema, its objects closed unless it opens them (closed.py)."""
    schema = tool["function"].get("parameters") or {"type": "object", "properties": {}}
    schema = json.loads(json.dumps(schema))  # (a copy: the request's is left as sent)
    check_optional_properties(schema)
    return closed_objects(schema)


def call_schema(tools: list[dict], at: str, definitions: dict) -> dict:
    """One call of any of the tools, {"name": <its name>, "arguments": <its parameters>},
    to sit at pointer `at` of a schema whose root $defs are `definitions`."""
    options = []
    for i, tool in enumerate(tools):
        where = at if len(tools) == 1 else f"{at}/anyOf/{i}"
        arguments = embedded(parameters(tool), f"{where}/properties/arguments", f"tool{i}_",
                             definitions)
        options.append({"type": "object", "additionalProperties": False,
                        "required": ["name", "arguments"],
                        "properties": {"name": {"const": tool["function"]["name"]},
                                       "arguments": arguments}})
    return options[0] if len(options) == 1 else {"anyOf": options}


def plan(tools: list[dict] | None, tool_choice, chat_template: str | None,
         special_tokens: set[str], parallel: bool = True,
         reply_schema: dict | None = None) -> ToolPlan | None:
    """The constraint a request's tools ask for; None where the output is free text.
    reply_schema: the JSON schema a text reply follows (None: any text)."""
    if not tools or tool_choice == "none":
        return None
    names = [t["function"]["name"] for t in tools]
    if isinstance(tool_choice, dict):
        name = tool_choice["function"]["name"]
        if name not in names:
            raise APIError(400, f"tool_choice names the function {shown(name)}, which is not in "
                                f"tools ({', '.join(map(repr, names))})", param="tool_choice")
        return ToolPlan("arguments", StructuredOutputs(json=parameters(tools[names.index(name)])),
                        function=name)
    required = tool_choice == "required"  # else "auto", given or by default
    if declares_tool_calls(chat_template):
        special = TAG_OPEN in special_tokens
        grammar = _tagged_grammar(tools, required, parallel, reply_schema, special)
        return ToolPlan("tagged", StructuredOutputs(grammar=grammar),
                        skip_special_tokens=False if special else None)
    schema = json_layout_schema(tools, required, parallel, reply_schema)
    return ToolPlan("json", StructuredOutputs(json=schema),
                    reply_is_json=reply_schema is not None)


def json_layout_schema(tools: list[dict], required: bool, parallel: bool,
                       reply_schema: dict | None) -> dict:
    """{"tool_calls": [calls]} (one call unless parallel), or, unless required,
    {"response": <text, or a value of reply_schema>}."""
    definitions: dict = {}
    calls_at = "#/anyOf/0" if not required else "#"
    calls = {"type": "object", "additionalProperties": False, "required": ["tool_calls"],
             "properties": {"tool_calls": {
                 "type": "array", "minItems": 1, **({} if parallel else {"maxItems": 1}),
                 "items": call_schema(tools, f"{calls_at}/properties/tool_calls/items",
                                      definitions)}}}
    if required:
        schema = calls
    else:
        reply = {"type": "string"} if reply_schema is None else embedded(
            json.loads(json.dumps(reply_schema)), "#/anyOf/1/properties/response", "reply_",
            definitions)
        schema = {"anyOf": [calls, {"type": "object", "additionalProperties": False,
                                    "required": ["response"], "properties": {"response": reply}}]}
    if definitions:
        schema["$defs"] = definitions
    return schema


def _tagged_grammar(tools: list[dict], required: bool, parallel: bool,
                    reply_schema: dict | None, special: bool) -> str:
    """A Lark grammar (llguidance's dialect) of the tagged layout: calls in <tool_call>
    tags, after free text (auto), alone (required), or instead of a JSON reply (auto
    with reply_schema). Each tag holds one JSON call, compact as JSON_LAYOUT writes it."""
    definitions: dict = {}
    call = call_schema(tools, "#", definitions)
    if definitions:
        call["$defs"] = definitions
    call_json = "%json " + json.dumps({**call, "x-guidance": JSON_LAYOUT})
    open_tag = TAG_OPEN if special else json.dumps(TAG_OPEN)
    close = json.dumps("\n" + TAG_CLOSE)
    lines = ["%llguidance {}"]
    if required or reply_schema is not None:
        calls = "call (\"\\n\" call)*" if parallel else "call"
        if required or reply_schema is None:
            lines.append(f"start: {calls}")
        else:
            reply = json.loads(json.dumps(reply_schema))
            lines.append(f"start: {calls} | %json " + json.dumps({**reply, "x-guidance": JSON_LAYOUT}))
        lines.append(f'call: {open_tag} "\\n" {call_json} {close}')
    else:  # free text; a tag, once opened, holds a call
        lines += ["start: (tagged)* TEXT" if parallel else "start: TEXT | tagged",
                  "TEXT: /(.|\\n)*/"]
        if special:
            lines.append(f'tagged: TEXT {open_tag} "\\n" {call_json} {close}')
        else:
            lines += [f"opened[lazy]: TEXT {open_tag}",
                      f'tagged: opened "\\n" {call_json} {close}']
    return "\n".join(lines) + "\n"


def template_tools(tools: list[dict] | None, tool_choice, chat_template: str | None) -> list[dict] | None:
    """The tools as the chat template is given them: only a tagged template's, and none
    for tool_choice "none" (elsewhere tool_prompt.py describes them)."""
    if not tools or tool_choice == "none" or not declares_tool_calls(chat_template):
        return None
    return tools
