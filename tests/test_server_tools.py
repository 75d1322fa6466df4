"""Tool calls through the official OpenAI client: tool_choice "required" and a named
function give valid tool_calls (streamed and not); "none" gives text; "auto" works
where the chat template declares <tool_call> tags and is refused by name elsewhere;
earlier calls and tool answers go through the template."""
import json

import httpx
import pytest

from helpers import write_tiny_model
from serving import ServerThread, client_for, running_tiny_chat_server
from tinypaged import LLM
from tinypaged.serve import tools as tool_calls
from tinypaged.structured import StructuredOutputs

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "additionalProperties": False, "required": ["city", "unit"],
                   "properties": {"city": {"type": "string", "pattern": "^[A-Z][a-z]{1,8}$"},
                                  "unit": {"enum": ["celsius", "fahrenheit"]}}}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "parameters": {"type": "object", "additionalProperties": False,
                                       "required": ["zone"],
                                       "properties": {"zone": {"enum": ["UTC", "CET"]}}}}}
USER = [{"role": "user", "content": "What is the weather in Paris?"}]

# Qwen's tool-call format, cut down: tools in a system turn, calls in <tool_call> tags
TOOL_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\nTools: {% for t in tools %}{{ t | tojson }}{% endfor %}"
    "\nCall one as <tool_call>\n{\"name\": ..., \"arguments\": ...}\n</tool_call><|im_end|>\n"
    "{% endif %}{% for m in messages %}{% if m.role == 'assistant' and m.tool_calls %}"
    "<|im_start|>assistant\n{% for c in m.tool_calls %}<tool_call>\n"
    "{{ {'name': c.function.name, 'arguments': c.function.arguments} | tojson }}\n</tool_call>"
    "{% endfor %}<|im_end|>\n{% elif m.role == 'tool' %}<|im_start|>user\n<tool_response>\n"
    "{{ m.content }}\n</tool_response><|im_end|>\n{% else %}<|im_start|>{{ m.role }}\n"
    "{{ m.content }}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@pytest.fixture(scope="module")
def tiny_chat(tmp_path_factory):
    yield from running_tiny_chat_server(tmp_path_factory.mktemp("serve") / "tiny")


@pytest.fixture(scope="module")
def tool_server(tmp_path_factory):
    folder = tmp_path_factory.mktemp("serve") / "tools"
    write_tiny_model(str(folder), seed=5, max_position_embeddings=1024)
    with open(folder / "tokenizer_config.json", "w") as f:
        json.dump({"eos_token": "<|im_end|>", "chat_template": TOOL_TEMPLATE}, f)
    llm = LLM(folder, backend="cpu", block_size=4, num_blocks=800)
    server = ServerThread(llm)
    yield server
    server.stop()
    llm.close()


def valid_weather(arguments: str) -> bool:
    args = json.loads(arguments)
    return set(args) == {"city", "unit"} and args["unit"] in ("celsius", "fahrenheit")


def test_required_and_named_give_valid_tool_calls(tiny_chat):
    client = client_for(tiny_chat)
    for seed in range(3):
        out = client.chat.completions.create(model="tiny", messages=USER, tools=[WEATHER, TIME],
                                             tool_choice="required", max_tokens=80, seed=seed)
        choice = out.choices[0]
        assert choice.finish_reason == "tool_calls" and choice.message.content is None
        call = choice.message.tool_calls[0]
        assert call.id.startswith("call_") and call.type == "function"
        assert call.function.name in ("get_weather", "get_time")
        if call.function.name == "get_weather":
            assert valid_weather(call.function.arguments)
        else:
            assert json.loads(call.function.arguments)["zone"] in ("UTC", "CET")
    named = {"type": "function", "function": {"name": "get_weather"}}
    out = client.chat.completions.create(model="tiny", messages=USER, tools=[WEATHER, TIME],
                                         tool_choice=named, max_tokens=80, seed=7)
    call = out.choices[0].message.tool_calls[0]
    assert call.function.name == "get_weather" and valid_weather(call.function.arguments)


def test_tool_calls_stream_as_deltas(tiny_chat):
    client = client_for(tiny_chat)
    named = {"type": "function", "function": {"name": "get_weather"}}
    for choice in ("required", named):
        stream = client.chat.completions.create(model="tiny", messages=USER, tools=[WEATHER],
                                                tool_choice=choice, max_tokens=80, seed=3,
                                                stream=True)
        calls, finish = {}, None
        for chunk in stream:
            delta = chunk.choices[0].delta
            for c in delta.tool_calls or []:
                entry = calls.setdefault(c.index, {"name": "", "arguments": ""})
                entry["name"] += c.function.name or ""
                entry["arguments"] += c.function.arguments or ""
            finish = chunk.choices[0].finish_reason or finish
        assert finish == "tool_calls" and calls[0]["name"] == "get_weather"
        assert valid_weather(calls[0]["arguments"])


def test_none_gives_text_and_auto_needs_a_declared_format(tiny_chat):
    client = client_for(tiny_chat)
    out = client.chat.completions.create(model="tiny", messages=USER, tools=[WEATHER],
                                         tool_choice="none", max_tokens=8, seed=1)
    assert out.choices[0].message.tool_calls is None and out.choices[0].message.content
    for choice in ({"tool_choice": "auto"}, {}):  # given, or by default
        r = httpx.post(tiny_chat.url + "/v1/chat/completions", timeout=60, json={
            "messages": USER, "tools": [WEATHER], "max_tokens": 8, **choice})
        assert r.status_code == 400 and r.json()["error"]["param"] == "tool_choice"
        assert "<tool_call>" in r.json()["error"]["message"]
    bad = [{"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
           {"tools": [{"type": "function", "function": {"name": "bad name!"}}],
            "tool_choice": "required"},
           {"tools": [WEATHER], "tool_choice": "required", "response_format": {"type": "json_object"}}]
    for body in bad:
        r = httpx.post(tiny_chat.url + "/v1/chat/completions", timeout=60,
                       json={"messages": USER, "max_tokens": 8, **body})
        assert r.status_code == 400, r.text
    assert tiny_chat.llm.stats()["blocks_used"] == 0


def test_auto_where_the_template_declares_tool_call_tags(tool_server):
    client = client_for(tool_server)
    out = client.chat.completions.create(model="tools", messages=USER, tools=[WEATHER],
                                         tool_choice="auto", max_tokens=12, seed=2)
    assert out.choices[0].message.content  # the random model writes text, free
    llm = tool_server.llm
    plan = tool_calls.plan([WEATHER], "auto", llm.tokenizer.chat_template,
                           llm.tokenizer.special_tokens)
    compiled = llm.engine.grammars.compile(plan.constraint)
    call = '<tool_call>\n{"name":"get_weather","arguments":{"city":"Paris","unit":"celsius"}}\n</tool_call>'
    assert compiled.accepts("Let me look. " + call)  # once the tag opens, a valid call
    assert not compiled.accepts("Let me look. " + call.replace("celsius", "kelvin"))
    assert not compiled.accepts('<tool_call>\n{"name":"get_time","arguments":{}}\n</tool_call>')
    content, calls = tool_calls.parse("Let me look. " + call, plan)
    assert content == "Let me look." and calls[0]["function"]["name"] == "get_weather"
    assert json.loads(calls[0]["function"]["arguments"]) == {"city": "Paris", "unit": "celsius"}


def test_earlier_calls_and_tool_answers_go_through_the_template(tool_server):
    history = USER + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "Paris", "unit": "celsius"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "21 degrees, sunny"}]
    r = httpx.post(tool_server.url + "/tokenize", json={"messages": history}, timeout=60)
    text = tool_server.llm.tokenizer.decode(r.json()["tokens"])
    assert '"city": "Paris"' in text and "<tool_response>\n21 degrees, sunny" in text
    client = client_for(tool_server)
    out = client.chat.completions.create(model="tools", messages=history, max_tokens=6, seed=1)
    assert out.choices[0].finish_reason in ("stop", "length")
