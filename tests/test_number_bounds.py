"""Numbers a JSON schema leaves unbounded are bounded as llama.cpp bounds them (16
integer digits; here 10 after the point), so a sampled number cannot run on digit after
digit; a bound the schema gives is kept."""
import json

import pytest

from tinypaged import LLM, SamplingParams
from tinypaged.structured import StructuredOutputs
from tinypaged.structured.number_bounds import bounded_numbers


def one(schema: dict) -> dict:
    return {"type": "object", "properties": {"n": schema}, "required": ["n"],
            "additionalProperties": False}


def test_every_unbounded_number_of_a_schema_is_bounded_and_data_is_left_alone():
    schema = {"type": "object", "$defs": {"count": {"type": "integer"}},
              "properties": {"a": {"$ref": "#/$defs/count"},
                             "b": {"type": "array", "items": {"type": ["number", "null"]}},
                             "c": {"anyOf": [{"type": "integer", "minimum": 0}, {"type": "string"}]},
                             "d": {"type": "number", "maximum": 5, "multipleOf": 0.5},
                             "e": {"enum": [{"type": "integer"}], "default": {"type": "number"}}}}
    before = json.dumps(schema)
    out = bounded_numbers(schema)
    assert json.dumps(schema) == before  # (a copy)
    assert out["$defs"]["count"] == {"type": "integer", "minimum": -(10**16 - 1), "maximum": 10**16 - 1}
    assert out["properties"]["b"]["items"] == {"type": ["number", "null"], "minimum": -1e16,
                                               "maximum": 1e16, "multipleOf": 1e-10}
    assert out["properties"]["c"]["anyOf"][0] == {"type": "integer", "minimum": 0, "maximum": 10**16 - 1}
    assert out["properties"]["d"] == {"type": "number", "maximum": 5, "multipleOf": 0.5, "minimum": -1e16}
    assert out["properties"]["e"] == schema["properties"]["e"]


@pytest.fixture(scope="module")
def grammars(stories_dir):
    llm = LLM(stories_dir)
    yield llm.engine.grammars
    llm.close()


@pytest.mark.parametrize("schema, fits, too_long", [
    ({"type": "integer"}, ["9" * 16, "-" + "9" * 16, "0"], ["1" * 17, "-" + "1" * 17]),
    ({"type": "number"}, ["9" * 16, "-3.5", "0." + "1" * 10], ["1" * 17, "0." + "1" * 11]),
    ({"type": "integer", "maximum": 10**18}, ["1" * 18], []),  # (the schema's own bound kept)
])
def test_the_grammar_takes_16_integer_digits_and_no_more(grammars, schema, fits, too_long):
    compiled = grammars.compile(StructuredOutputs(json=one(schema)))
    for digits in fits:
        assert compiled.accepts('{"n":' + digits + "}"), digits
    for digits in too_long:
        assert not compiled.accepts('{"n":' + digits + "}"), digits


def test_sampled_numbers_end_before_max_tokens(stories_dir):
    """Temperature 1 on stories260K, whose digits would run on: every answer ends, and
    parses, well before max_tokens."""
    llm = LLM(stories_dir)
    schema = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "number"}},
              "required": ["a", "b"], "additionalProperties": False}
    params = [SamplingParams(temperature=1.0, seed=seed, max_tokens=120,
                             structured_outputs=StructuredOutputs(json=schema)) for seed in range(16)]
    for out in llm.generate(["Once upon a time"] * 16, params):
        sample = out.outputs[0]
        assert sample.finish_reason == "stop", sample.text
        value = json.loads(sample.text)
        assert abs(value["a"]) < 10**16 and abs(value["b"]) <= 1e16
