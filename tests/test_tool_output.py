"""Tool outputs read back (serve/tool_output.py): every layout's reply and calls, fed a
character at a time as a stream would be, send deltas that add up to the finished
answer; a call cut short is still a call; the plans' grammars hold the layouts
(parallel_tool_calls, a JSON reply beside tools, $defs inside a tool's parameters)."""
import json

import pytest

from helpers import write_tiny_model
from tinypaged.serve import tool_output, tool_prompt, tools
from tinypaged.structured.grammar import Grammars
from tinypaged.tokenizer import Tokenizer

ADDRESS = {"type": "object", "properties": {"street": {"type": "string"}}, "required": ["street"]}
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "required": ["city"], "$defs": {"Address": ADDRESS},
    "properties": {"city": {"type": "string"}, "where": {"$ref": "#/$defs/Address"}}}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "required": ["zone"], "properties": {"zone": {"enum": ["UTC", "CET"]}}}}}
REPLY = {"type": "object", "properties": {"answer": {"type": "integer"}}, "required": ["answer"]}
TAGGED = "{% for m in messages %}{{ m.content }}{% endfor %}<tool_call>"

ONE = '{"name":"get_weather","arguments":{"city":"Par\\u00eds \\"x\\" \\ud83d\\ude00","where":{"street":"Rue"}}}'
TWO = '{"name":"get_time","arguments":{"zone":"UTC"}}'
PLAIN = '{"name":"get_weather","arguments":{"city":"Paris","where":{"street":"Rue"}}}'


def plan(template=None, choice="auto", parallel=True, reply=None):
    return tools.plan([WEATHER, TIME], choice, template, set(), parallel, reply)


def tag(call: str) -> str:
    return f"<tool_call>\n{call}\n</tool_call>"


# (plan, finished output, content, [(name, arguments)])
CASES = [
    (plan(), '{"tool_calls":[%s,%s]}' % (ONE, TWO), None,
     [("get_weather", json.loads(ONE)["arguments"]), ("get_time", {"zone": "UTC"})]),
    (plan(), '{"response":"Hi \\"you\\" \\u00e9t\\u00e9 \\ud83d\\ude00\\n"}', 'Hi "you" été 😀\n', []),
    (plan(reply=REPLY), '{"response":{"answer":42}}', '{"answer":42}', []),
    (plan(TAGGED), "Let me look <tools>. " + tag(ONE) + "\n" + tag(TWO), "Let me look <tools>.",
     [("get_weather", json.loads(ONE)["arguments"]), ("get_time", {"zone": "UTC"})]),
    (plan(TAGGED), "Just text, <tool no call", "Just text, <tool no call", []),
    (plan(TAGGED, reply=REPLY), '{"answer":7}', '{"answer":7}', []),
    (plan(choice={"type": "function", "function": {"name": "get_time"}}), '{"zone":"CET"}', None,
     [("get_time", {"zone": "CET"})]),
]


@pytest.mark.parametrize("case", range(len(CASES)))
def test_streamed_deltas_add_up_to_the_answer(case):
    tool_plan, text, content, calls = CASES[case]
    final_content, final_calls, finish = tool_output.answer(text, "stop", tool_plan)
    assert final_content == content
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"]))
            for c in final_calls] == calls
    assert finish == ("tool_calls" if calls else "stop")
    stream, sent, names, arguments = tool_output.ToolStream(tool_plan), "", [], []
    for end in range(1, len(text) + 1):
        for delta in stream.deltas(text[:end], end == len(text)):
            sent += delta.get("content", "")
            for call in delta.get("tool_calls", []):
                if "id" in call:
                    assert call["index"] == len(names) and call["id"].startswith("call_")
                    names.append(call["function"]["name"])
                    arguments.append("")
                arguments[call["index"]] += call["function"]["arguments"]
    assert sent == (content or "")
    assert names == [name for name, _ in calls]
    assert arguments == [c["function"]["arguments"] for c in final_calls]
    if calls:  # arguments came in many deltas, while they were written
        assert len(arguments[0]) > 5


def test_a_call_cut_by_max_tokens_is_still_a_call():
    text = '{"tool_calls":[%s,%s]}' % (ONE, TWO)
    cut = text[:text.index('"where"') + 3]
    content, calls, finish = tool_output.answer(cut, "length", plan())
    assert content is None and finish == "length" and len(calls) == 1
    assert calls[0]["function"]["name"] == "get_weather"
    assert calls[0]["function"]["arguments"] == cut[cut.index('{"city"'):]
    content, calls, finish = tool_output.answer('{"tool_calls":[{"name":"get_w', "length", plan())
    assert (content, calls, finish) == (None, [], "length")  # no name yet: no call, no wrapper
    content, calls, _ = tool_output.answer("Sure. <tool_call>\n" + ONE[:30], "length", plan(TAGGED))
    assert content == "Sure." and calls[0]["function"]["name"] == "get_weather"


@pytest.fixture(scope="module")
def grammars(tmp_path_factory):
    folder = str(tmp_path_factory.mktemp("tiny"))
    write_tiny_model(folder, seed=3)
    return Grammars(Tokenizer(folder), 512, [0], cache_bytes=64 << 20)


@pytest.mark.parametrize("template", [None, TAGGED])
def test_the_grammars_hold_each_layout(grammars, template):
    def accepts(tool_plan, text):
        return grammars.compile(tool_plan.constraint).accepts(text)

    def calls(*items):
        return tag(items[0]) + "".join("\n" + tag(c) for c in items[1:]) if template \
            else '{"tool_calls":[%s]}' % ",".join(items)

    reply = '{"response":"hi"}' if template is None else "hi"
    json_reply = '{"response":{"answer":1}}' if template is None else '{"answer":1}'
    for choice in ("auto", "required"):
        assert accepts(plan(template, choice), calls(PLAIN))
        assert accepts(plan(template, choice), calls(PLAIN, TWO))
        assert not accepts(plan(template, choice, parallel=False), calls(PLAIN, TWO))
        assert accepts(plan(template, choice, parallel=False), calls(TWO))
        assert not accepts(plan(template, choice), calls(PLAIN.replace('"Rue"}', '"Rue","n":1}')))
        assert not accepts(plan(template, choice), calls(TWO.replace("UTC", "PST")))
        assert accepts(plan(template, choice), reply) == (choice == "auto")
        assert not accepts(plan(template, choice, reply=REPLY), reply)
        assert accepts(plan(template, choice, reply=REPLY), json_reply) == (choice == "auto")


def test_a_template_without_a_format_gets_plain_messages_and_a_description():
    history = [{"role": "user", "content": "Weather?"},
               {"role": "assistant", "content": "", "tool_calls": [
                   {"id": "c1", "type": "function",
                    "function": {"name": "get_time", "arguments": {"zone": "UTC"}}},
                   {"id": "c2", "type": "function",
                    "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
               {"role": "tool", "tool_call_id": "c1", "content": "noon"},
               {"role": "tool", "tool_call_id": "c2", "content": "sunny"}]
    chatml = "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% endfor %}"
    tool_plan = plan()
    messages = tool_prompt.conversation(history, [WEATHER, TIME], tool_plan, False, True, None,
                                        chatml)
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user"]
    assert all(set(m) == {"role", "content"} for m in messages)
    assert '"name": "get_weather"' in messages[0]["content"]
    assert '{"response": <your reply>}' in messages[0]["content"]
    assert json.loads(messages[2]["content"])["tool_calls"][1] == {
        "name": "get_weather", "arguments": {"city": "Paris"}}
    answers = [json.loads(line)["tool_response"] for line in messages[3]["content"].splitlines()]
    assert answers == [{"name": "get_time", "content": "noon"},
                       {"name": "get_weather", "content": "sunny"}]
    no_system = ("{% for m in messages %}{% if m.role not in ['user', 'assistant'] %}"
                 "{{ raise_exception('user and assistant only') }}{% endif %}{{ m.content }}"
                 "{% endfor %}")
    messages = tool_prompt.conversation(history[:1], [WEATHER], tool_plan, False, True, None,
                                        no_system)
    assert [m["role"] for m in messages] == ["user"]
    assert messages[0]["content"].startswith("You can call") and \
        messages[0]["content"].endswith("Weather?")
    assert tool_prompt.conversation(history, [WEATHER], plan(TAGGED), False, True, None,
                                    TAGGED) is history  # a tagged template reads them itself
