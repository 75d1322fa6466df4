"""The conversation as a template without a tool-call format is given it (the "json"
and "arguments" layouts of tools.py): the tools and the answer's form described in a
system message, earlier calls written as the JSON the model is held to, and tool
answers as a user turn. Such a template knows only system, user and assistant
messages of text, so that is all it gets; one that may refuse a system message
finds the description at the top of the first user message."""
from __future__ import annotations

import json

from .tools import ToolPlan, declares_tool_calls


def describe_tools(tools: list[dict], plan: ToolPlan, required: bool, parallel: bool,
                   reply_schema: dict | None) -> str:
    """The system message's text: each tool's definition, and the form of the answer."""
    lines = ["You can call these tools (each with its arguments' JSON schema):"]
    lines += [json.dumps(t["function"], ensure_ascii=False) for t in tools]
    if plan.layout == "arguments":
        lines.append(f"Call the tool {plan.function}: answer with its arguments, one JSON object.")
        return "\n".join(lines)
    calls = '{"tool_calls": [{"name": <a tool\'s name>, "arguments": <its arguments>}' + \
            (", ...]}" if parallel else "]}")
    how_many = "one or more calls" if parallel else "exactly one call"
    if required:
        lines.append(f"Answer with one JSON object that calls tools ({how_many}): {calls}")
    else:
        reply = "<your reply>" if reply_schema is None else \
            "<your reply, JSON valid against this schema: " + json.dumps(reply_schema) + ">"
        lines.append(f"Answer with one JSON object: {calls} to call tools ({how_many}), or "
                     f'{{"response": {reply}}} to answer the user directly.')
    return "\n".join(lines)


def plain_messages(messages: list[dict]) -> list[dict]:
    """messages with an assistant's calls written as {"tool_calls": [...]} text and each
    run of tool answers as one user message of {"tool_response": ...} lines."""
    names = {}  # call id -> function name, for the answers
    out = []
    for message in messages:
        if message["role"] == "tool":
            name = message.get("name") or names.get(message.get("tool_call_id"))
            line = json.dumps({"tool_response": {"name": name, "content": message["content"]}},
                              ensure_ascii=False)
            if out and out[-1].get("from_tools"):
                out[-1]["content"] += "\n" + line
            else:
                out.append({"role": "user", "content": line, "from_tools": True})
            continue
        if message.get("tool_calls"):
            calls = message["tool_calls"]
            names.update((c.get("id"), c["function"]["name"]) for c in calls)
            text = json.dumps({"tool_calls": [
                {"name": c["function"]["name"], "arguments": c["function"]["arguments"]}
                for c in calls]}, ensure_ascii=False)
            out.append({"role": "assistant", "content": text})
            continue
        out.append({"role": message["role"], "content": message["content"]})
    for message in out:
        message.pop("from_tools", None)
    return out


def with_description(messages: list[dict], description: str, chat_template: str) -> list[dict]:
    """messages with the description added to the system message (one is made where
    there is none), or to the first user message where the template may refuse one
    (it raises errors and never names the system role: Mistral's and Gemma's first)."""
    messages = [dict(m) for m in messages]
    if messages and messages[0]["role"] == "system":
        messages[0]["content"] = f"{messages[0]['content']}\n\n{description}"
    elif "system" in chat_template or "raise_exception" not in chat_template:
        messages.insert(0, {"role": "system", "content": description})
    else:
        first = next((i for i, m in enumerate(messages) if m["role"] == "user"), None)
        if first is None:
            messages.insert(0, {"role": "user", "content": description})
        else:
            messages[first]["content"] = f"{description}\n\n{messages[first]['content']}"
    return messages


def has_tool_turns(messages: list[dict]) -> bool:
    return any(m["role"] == "tool" or m.get("tool_calls") for m in messages)


def conversation(messages: list[dict], tools: list[dict] | None, plan: ToolPlan | None,
                 required: bool, parallel: bool, reply_schema: dict | None,
                 chat_template: str) -> list[dict]:
    """The messages the chat template renders: as sent for a tagged template, which
    reads tools and tool turns itself; plain, with the tools described, elsewhere."""
    if declares_tool_calls(chat_template):
        return messages
    if has_tool_turns(messages):
        messages = plain_messages(messages)
    if plan is not None:
        description = describe_tools(tools, plan, required, parallel, reply_schema)
        messages = with_description(messages, description, chat_template)
    return messages
