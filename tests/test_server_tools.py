"""Tool calls through the official OpenAI client, with a template that declares no
tool-call format (the JSON layout) and with one that declares <tool_call> tags:
"required" and a named function give valid tool_calls; "auto" (or no tool_choice)
gives calls or text, never the JSON wrapper; arguments stream while written, the same
as unstreamed; parallel_tool_calls false gives one call; response_format beside tools
holds a text reply; a call cut by max_tokens is a call with finish_reason "length";
earlier calls and tool answers go through the template."""
import json
from pathlib import Path

import httpx
import pytest

from helpers import write_tiny_model
from serving import ServerThread, client_for
from tinypaged import LLM
from tinypaged.serve import tool_output, tools as tool_calls

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
    """ChatML, no tool-call format: the tools' description makes prompts long."""
    folder = tmp_path_factory.mktemp("serve") / "tiny"
    write_tiny_model(str(folder), seed=3, max_position_embeddings=2048)
    llm = LLM(folder, backend="cpu", block_size=4, num_blocks=2000)
    server = ServerThread(llm)
    yield server
    server.stop()
    llm.close()


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
                                             tool_choice="required", parallel_tool_calls=False,
                                             max_tokens=200, seed=seed)
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
                                         tool_choice=named, max_tokens=200, seed=7)
    call = out.choices[0].message.tool_calls[0]
    assert call.function.name == "get_weather" and valid_weather(call.function.arguments)


def streamed(stream) -> tuple[str, dict, str]:
    """(content, {index: (name, arguments)}, finish reason) of a streamed answer, and
    how many deltas the first call's arguments came in."""
    content, calls, finish, pieces = "", {}, None, 0
    for chunk in stream:
        delta = chunk.choices[0].delta
        content += delta.content or ""
        for c in delta.tool_calls or []:
            name, arguments = calls.get(c.index, ("", ""))
            calls[c.index] = (name + (c.function.name or ""), arguments + (c.function.arguments or ""))
            pieces += c.index == 0 and bool(c.function.arguments)
        finish = chunk.choices[0].finish_reason or finish
    return content, calls, finish, pieces


def test_arguments_stream_while_written_and_equal_the_unstreamed(tiny_chat):
    client = client_for(tiny_chat)
    named = {"type": "function", "function": {"name": "get_weather"}}
    for choice in ("required", named):
        args = dict(model="tiny", messages=USER, tools=[WEATHER], tool_choice=choice,
                    parallel_tool_calls=False, max_tokens=200, seed=3)
        whole = client.chat.completions.create(**args).choices[0]
        content, calls, finish, pieces = streamed(client.chat.completions.create(**args, stream=True))
        assert finish == whole.finish_reason == "tool_calls" and not content
        call = whole.message.tool_calls[0]
        assert calls == {0: (call.function.name, call.function.arguments)}
        assert calls[0][0] == "get_weather" and valid_weather(calls[0][1])
        assert pieces > 3  # a delta per token or so, not one at the end


def test_auto_works_with_any_template(tiny_chat):
    client = client_for(tiny_chat)
    kinds = set()
    for seed in range(6):
        for choice in ({"tool_choice": "auto"}, {}):  # given, or by default
            out = client.chat.completions.create(model="tiny", messages=USER, tools=[WEATHER, TIME],
                                                 max_tokens=100, seed=seed, **choice).choices[0]
            if out.message.tool_calls:  # (a random model may list calls until max_tokens)
                kinds.add("calls")
                assert out.finish_reason in ("tool_calls", "length") and out.message.content is None
                assert {c.function.name for c in out.message.tool_calls} <= {"get_weather", "get_time"}
            else:
                kinds.add("text")
                assert out.finish_reason in ("stop", "length")
                content = out.message.content or ""
                assert '"response"' not in content and '"tool_calls"' not in content
    assert kinds == {"calls", "text"}, kinds  # both ways, each read back
    llm = tiny_chat.llm
    plan = tool_calls.plan([WEATHER], "auto", llm.tokenizer.chat_template, set())
    compiled = llm.engine.grammars.compile(plan.constraint)
    reply = '{"response":"It is sunny."}'
    assert compiled.accepts(reply) and tool_output.answer(reply, "stop", plan) == (
        "It is sunny.", [], "stop")


def test_parallel_tool_calls_false_gives_one_call(tiny_chat):
    client = client_for(tiny_chat)
    for seed in range(4):
        out = client.chat.completions.create(model="tiny", messages=USER, tools=[WEATHER, TIME],
                                             tool_choice="required", parallel_tool_calls=False,
                                             max_tokens=200, seed=seed).choices[0]
        assert out.finish_reason == "tool_calls" and len(out.message.tool_calls) == 1


def test_response_format_beside_tools_holds_the_reply(tiny_chat):
    client = client_for(tiny_chat)
    answer = {"type": "object", "properties": {"answer": {"enum": ["yes", "no"]}},
              "required": ["answer"]}
    fmt = {"type": "json_schema", "json_schema": {"name": "answer", "schema": answer}}
    for seed in range(4):
        out = client.chat.completions.create(model="tiny", messages=USER, tools=[WEATHER],
                                             response_format=fmt, max_tokens=100,
                                             seed=seed).choices[0]
        if out.message.tool_calls is None and out.finish_reason == "stop":
            assert json.loads(out.message.content)["answer"] in ("yes", "no")
    r = httpx.post(tiny_chat.url + "/v1/chat/completions", timeout=60, json={
        "messages": USER, "tools": [WEATHER], "guided_regex": "a+", "max_tokens": 4})
    assert r.status_code == 400 and "JSON schema" in r.json()["error"]["message"]


def test_a_call_cut_by_max_tokens_comes_back_as_a_call(tiny_chat):
    client = client_for(tiny_chat)
    head = len('{"tool_calls":[{"name":"get_weather","arguments":{"ci')  # a byte a token
    for stream in (False, True):
        args = dict(model="tiny", messages=USER, tools=[WEATHER], tool_choice="required",
                    max_tokens=head, seed=1)
        if stream:
            content, calls, finish, _ = streamed(client.chat.completions.create(**args, stream=True))
            name, arguments = calls[0]
        else:
            out = client.chat.completions.create(**args).choices[0]
            content, finish = out.message.content, out.finish_reason
            name, arguments = out.message.tool_calls[0].function.name, \
                out.message.tool_calls[0].function.arguments
        assert finish == "length" and not content
        assert name == "get_weather" and arguments.startswith('{"ci') and len(arguments) < 8


def test_none_gives_text_and_bad_choices_are_refused(tiny_chat):
    client = client_for(tiny_chat)
    out = client.chat.completions.create(model="tiny", messages=USER, tools=[WEATHER],
                                         tool_choice="none", max_tokens=8, seed=1)
    assert out.choices[0].message.tool_calls is None and out.choices[0].message.content
    bad = [{"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
           {"tools": [{"type": "function", "function": {"name": "bad name!"}}],
            "tool_choice": "required"},
           {"tools": [WEATHER], "parallel_tool_calls": "yes"}]
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
    content, calls, finish = tool_output.answer("Let me look. " + call, "stop", plan)
    assert content == "Let me look." and calls[0]["function"]["name"] == "get_weather"
    assert json.loads(calls[0]["function"]["arguments"]) == {"city": "Paris", "unit": "celsius"}
    out = client.chat.completions.create(model="tools", messages=USER, tools=[WEATHER],
                                         tool_choice="required", max_tokens=200, seed=2)
    assert out.choices[0].finish_reason == "tool_calls"
    assert valid_weather(out.choices[0].message.tool_calls[0].function.arguments)


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


def test_unset_parallel_tool_calls_follows_what_the_template_shows(tiny_chat, tool_server):
    """parallel_tool_calls unset: one call where the template writes no two calls in one
    turn (ChatML without tools here; SmolLM2's, Gemma's, Llama 3's: a small model
    otherwise repeats one call until max_tokens), several where it does; true asked
    for still allows several."""
    from tinypaged.tokenizer import Tokenizer
    assert not tool_calls.shows_parallel_calls(tiny_chat.llm.tokenizer.chat_template)
    assert tool_calls.shows_parallel_calls(tool_server.llm.tokenizer.chat_template)
    for name in ("smollm2", "llama3", "gemma3"):
        template = (Path(__file__).parent / "fixtures" / "chat_templates" / f"{name}.jinja").read_text()
        assert not tool_calls.shows_parallel_calls(template), name
    client = client_for(tiny_chat)
    counts = []
    for seed in range(8):
        out = client.chat.completions.create(model="tiny", messages=USER, tools=[WEATHER, TIME],
                                             tool_choice="required", max_tokens=300,
                                             seed=seed).choices[0]
        assert out.finish_reason == "tool_calls" and len(out.message.tool_calls) == 1, out
        asked = client.chat.completions.create(model="tiny", messages=USER, tools=[WEATHER, TIME],
                                               tool_choice="required", max_tokens=300, seed=seed,
                                               parallel_tool_calls=True).choices[0]
        counts.append(len(asked.message.tool_calls or []))
    assert max(counts) > 1, counts  # (the tiny model, allowed, makes several calls)
