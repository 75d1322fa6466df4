"""Tool calls: OpenAI's `tools` and `tool_choice` turned into a constraint on the
output, and the output turned back into `message.tool_calls`.

- "none": the tools are left out of the prompt; the model writes text.
- "required": the output is one JSON call {"name": ..., "arguments": {...}} of one of
  the tools, its arguments valid against that tool's parameters.
- a named function: the output is that function's arguments object.
- "auto": only where the chat template declares a tool-call format (Qwen's and
  Hermes' `<tool_call>` tags): free text, in which a `<tool_call>` tag, once
  opened, is held to a valid call (llguidance's lazy trigger) and parsed out.
  Elsewhere "auto" is refused by name: there is no way to tell a call from text.
"""
from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass

from ..structured import StructuredOutputs
from ..structured.closed import closed_objects
from ..structured.grammar import llguidance_module
from .errors import APIError, shown

TAG_OPEN, TAG_CLOSE = "<tool_call>", "</tool_call>"
TAGGED_CALL = re.compile(re.escape(TAG_OPEN) + r"\s*(\{.*?\})\s*" + re.escape(TAG_CLOSE), re.S)


@dataclass(slots=True)
class ToolPlan:
    mode: str  # "required", "named" or "auto"
    constraint: StructuredOutputs
    function: str | None = None  # the named function's name


def call_schema(tools: list[dict]) -> dict:
    """One call of any of the tools: {"name": <its name>, "arguments": <its parameters>}."""
    options = [{"type": "object", "additionalProperties": False, "required": ["name", "arguments"],
                "properties": {"name": {"const": t["function"]["name"]},
                               "arguments": parameters(t)}} for t in tools]
    return options[0] if len(options) == 1 else {"anyOf": options}


def parameters(tool: dict) -> dict:
    """A tool's parameters schema, its objects closed unless it opens them (closed.py)."""
    schema = tool["function"].get("parameters") or {"type": "object", "properties": {}}
    return closed_objects(json.loads(json.dumps(schema)))  # (a copy: the request's is left as sent)


def plan(tools: list[dict] | None, tool_choice, chat_template: str | None,
         special_tokens: set[str]) -> ToolPlan | None:
    """The constraint a request's tools ask for; None where the output is free text."""
    if not tools or tool_choice == "none":
        return None
    names = [t["function"]["name"] for t in tools]
    if isinstance(tool_choice, dict):
        name = tool_choice["function"]["name"]
        if name not in names:
            raise APIError(400, f"tool_choice names the function {shown(name)}, which is not in "
                                f"tools ({', '.join(map(repr, names))})", param="tool_choice")
        tool = tools[names.index(name)]
        return ToolPlan("named", StructuredOutputs(json=parameters(tool)), name)
    if tool_choice == "required":
        return ToolPlan("required", StructuredOutputs(json=call_schema(tools)))
    if not chat_template or TAG_OPEN not in chat_template:  # "auto", given or by default
        raise APIError(400, "tool_choice 'auto' needs a chat template that declares a "
                            "tool-call format (as Qwen's <tool_call> tags do); this model's "
                            "does not: use tool_choice 'required' or name a function",
                       param="tool_choice")
    StructTag = llguidance_module().StructTag
    tag = StructTag(trigger=TAG_OPEN, begin=TAG_OPEN + "\n", grammar=call_schema(tools),
                    end="\n" + TAG_CLOSE)
    grammar = StructTag.to_grammar([tag], assume_special=TAG_OPEN in special_tokens)
    return ToolPlan("auto", StructuredOutputs(grammar=grammar))


def parse(text: str, tool_plan: ToolPlan) -> tuple[str | None, list[dict]]:
    """(content, tool_calls in OpenAI's form) of an output made under tool_plan."""
    if tool_plan.mode == "named":
        return None, [tool_call(tool_plan.function, text)]
    if tool_plan.mode == "required":
        call = json.loads(text)
        return None, [tool_call(call["name"], json.dumps(call["arguments"]))]
    calls = []
    for match in TAGGED_CALL.finditer(text):
        try:
            call = json.loads(match.group(1))
        except json.JSONDecodeError:  # cut short by max_tokens: left as text
            continue
        calls.append(tool_call(call["name"], json.dumps(call["arguments"])))
    content = TAGGED_CALL.sub("", text).strip() if calls else text
    return content or None, calls


def tool_call(name: str, arguments: str) -> dict:
    return {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
            "function": {"name": name, "arguments": arguments}}


def template_tools(tools: list[dict] | None, tool_choice) -> list[dict] | None:
    """The tools as the chat template is given them (none for tool_choice "none")."""
    return None if not tools or tool_choice == "none" else tools
