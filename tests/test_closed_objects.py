"""Objects closed by default (structured/closed.py): the schema rewrite on its own,
then grammars compiled from schemas, tool parameters and response formats, held to
texts with and without extra keys."""
import json

import pytest

from tinypaged import LLM
from tinypaged.serve.tools import call_schema, parameters
from tinypaged.structured import StructuredOutputs
from tinypaged.structured.closed import closed_objects

CITY = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


def test_objects_with_properties_are_closed_at_every_depth():
    schema = closed_objects({
        "type": "object", "properties": {
            "a": {"type": "object", "properties": {"b": {"type": "integer"}}},
            "list": {"type": "array", "items": {"properties": {"c": {}}}},
            "either": {"anyOf": [{"properties": {"d": {}}}, {"type": "null"}]}},
        "$defs": {"Ref": {"type": "object", "properties": {"e": {}}}}})
    assert schema["additionalProperties"] is False
    assert schema["properties"]["a"]["additionalProperties"] is False
    assert schema["properties"]["list"]["items"]["additionalProperties"] is False
    assert schema["properties"]["either"]["anyOf"][0]["additionalProperties"] is False
    assert schema["$defs"]["Ref"]["additionalProperties"] is False
    assert "additionalProperties" not in schema["properties"]["a"]["properties"]["b"]


@pytest.mark.parametrize("opened", [{"additionalProperties": True},
                                    {"additionalProperties": {"type": "integer"}},
                                    {"patternProperties": {"^x": {}}},
                                    {"unevaluatedProperties": True}])
def test_a_schema_that_opens_an_object_keeps_it_open(opened):
    schema = closed_objects({"type": "object", "properties": {"a": {}}, **opened})
    assert {k: v for k, v in schema.items() if k in opened} == opened
    assert schema.get("additionalProperties", "unset") is not False


def test_objects_without_properties_and_allof_parts_stay_open():
    assert "additionalProperties" not in closed_objects({"type": "object"})
    schema = closed_objects({"allOf": [{"properties": {"a": {"properties": {"x": {}}}}},
                                       {"properties": {"b": {}}}]})
    assert all("additionalProperties" not in part for part in schema["allOf"])
    assert schema["allOf"][0]["properties"]["a"]["additionalProperties"] is False


def test_a_deep_schema_is_walked_without_recursion():
    schema = inner = {}
    for _ in range(20_000):  # deeper than Python's recursion limit
        inner["properties"] = {"x": {}}
        inner = inner["properties"]["x"]
    closed_objects(schema)
    assert schema["additionalProperties"] is False and inner == {}


def test_tool_parameters_are_closed_and_the_request_left_as_sent():
    tool = {"type": "function", "function": {"name": "weather", "parameters": json.loads(json.dumps(CITY))}}
    assert parameters(tool)["additionalProperties"] is False
    assert call_schema([tool], "#", {})["properties"]["arguments"]["additionalProperties"] is False
    assert tool["function"]["parameters"] == CITY


@pytest.fixture(scope="module")
def grammars(stories_dir):
    return LLM(stories_dir).engine.grammars


@pytest.mark.parametrize("schema, text, accepted", [  # (JSON_LAYOUT: no optional whitespace)
    (CITY, '{"city":"Paris"}', True),
    (CITY, '{"city":"Paris","country":"France"}', False),
    (CITY, '{"city":"Paris","city":"Lyon"}', False),
    ({**CITY, "additionalProperties": True}, '{"city":"Paris","country":"France"}', True),
    ({"type": "object"}, '{"anything":1}', True),
])
def test_the_grammar_admits_only_declared_keys_unless_opened(grammars, schema, text, accepted):
    compiled = grammars.compile(StructuredOutputs(json=schema))
    assert compiled.accepts(text) is accepted


def test_samples_of_an_open_schema_hold_only_its_keys(stories_dir):
    llm = LLM(stories_dir)
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8}},
              "required": ["city"]}  # no additionalProperties: closed here
    from tinypaged import SamplingParams
    outputs = llm.generate(["Once upon a time"] * 20, [SamplingParams(
        temperature=1.0, seed=seed, max_tokens=40, structured_outputs=StructuredOutputs(json=schema))
        for seed in range(20)])
    for out in outputs:
        assert out.outputs[0].finish_reason == "stop", out.text
        assert list(json.loads(out.text)) == ["city"], out.text
