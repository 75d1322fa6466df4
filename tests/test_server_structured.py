"""Structured outputs over HTTP: OpenAI's response_format (and the official client's
parse()), vLLM's structured_outputs and guided_*, llama.cpp's grammar and
json_schema; bad constraints are 400s naming the field, and leave the pool empty."""
import json
import re
from typing import Literal

import httpx
import pytest
from pydantic import BaseModel, ConfigDict, Field

from serving import client_for, running_server, running_tiny_chat_server

USER = [{"role": "user", "content": "Describe a pet."}]


@pytest.fixture(scope="module")
def tiny_chat(tmp_path_factory):
    yield from running_tiny_chat_server(tmp_path_factory.mktemp("serve") / "tiny")


@pytest.fixture(scope="module")
def stories(stories_dir):
    yield from running_server(stories_dir, served_model_name="stories")


class Pet(BaseModel):
    model_config = ConfigDict(extra="forbid")  # else the schema allows any more keys
    kind: Literal["cat", "dog", "fish"]
    age: int = Field(ge=0, le=20)
    name: str = Field(pattern="^[a-z]{1,6}$")


def test_the_openai_clients_parse_returns_a_parsed_object(tiny_chat):
    client = client_for(tiny_chat)
    for seed in range(3):
        out = client.chat.completions.parse(model="tiny", messages=USER, response_format=Pet,
                                            max_tokens=64, seed=seed)
        pet = out.choices[0].message.parsed
        assert isinstance(pet, Pet), out.choices[0].message.content
        assert out.choices[0].finish_reason == "stop"


def test_response_format_json_object_and_text(tiny_chat):
    client = client_for(tiny_chat)
    out = client.chat.completions.create(model="tiny", messages=USER, max_tokens=200, seed=1,
                                         response_format={"type": "json_object"})
    if out.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(out.choices[0].message.content), dict)
    else:  # cut by max_tokens: still the start of an object
        assert out.choices[0].message.content.startswith("{")
    # json_object with a schema, as llama.cpp's server reads it (instructor's JSON_SCHEMA mode)
    city = {"type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]}},
            "required": ["city"]}
    for seed in range(3):
        out = client.chat.completions.create(model="tiny", messages=USER, max_tokens=60, seed=seed,
                                             response_format={"type": "json_object",
                                                              "schema": city})
        assert json.loads(out.choices[0].message.content)["city"] in ("Paris", "Rome")
    free = client.chat.completions.create(model="tiny", messages=USER, max_tokens=8, seed=1,
                                          temperature=0, response_format={"type": "text"})
    plain = client.chat.completions.create(model="tiny", messages=USER, max_tokens=8, seed=1,
                                           temperature=0)
    assert free.choices[0].message.content == plain.choices[0].message.content


def test_a_json_schema_streamed_arrives_whole(tiny_chat):
    client = client_for(tiny_chat)
    fmt = {"type": "json_schema", "json_schema": {"name": "pet", "strict": True,
                                                  "schema": Pet.model_json_schema()}}
    stream = client.chat.completions.create(model="tiny", messages=USER, max_tokens=64, seed=4,
                                            response_format=fmt, stream=True)
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    Pet.model_validate_json(text)


@pytest.mark.parametrize("fields, check", [
    ({"structured_outputs": {"regex": "[a-z]{2,4}-[0-9]"}},
     lambda t: re.fullmatch("[a-z]{2,4}-[0-9]", t)),
    ({"structured_outputs": {"choice": ["alpha", "beta"]}}, lambda t: t in ("alpha", "beta")),
    ({"guided_choice": ["up", "down"]}, lambda t: t in ("up", "down")),
    ({"guided_regex": "[0-9]{3}"}, lambda t: re.fullmatch("[0-9]{3}", t)),
    ({"guided_json": {"type": "integer", "minimum": 5, "maximum": 7}},
     lambda t: json.loads(t) in (5, 6, 7)),
    ({"guided_grammar": 'root ::= "yes" | "no"'}, lambda t: t in ("yes", "no")),
    ({"grammar": 'root ::= [a-c]{3}'}, lambda t: re.fullmatch("[a-c]{3}", t)),
    ({"json_schema": {"enum": ["x", "y"]}}, lambda t: json.loads(t) in ("x", "y")),
])
def test_vllm_and_llama_cpp_fields_constrain_completions(stories, fields, check):
    r = httpx.post(stories.url + "/v1/completions", timeout=120, json={
        "prompt": "Once upon a time", "max_tokens": 32, "n": 3, "seed": 5, **fields})
    assert r.status_code == 200, r.text
    for choice in r.json()["choices"]:
        assert choice["finish_reason"] == "stop" and check(choice["text"]), choice


@pytest.mark.parametrize("fields, param, message", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nope"}}}},
     "response_format", "nope"),
    ({"response_format": {"type": "json_schema"}}, "response_format", "json_schema.schema"),
    ({"response_format": {"type": "xml"}}, "response_format", None),
    ({"structured_outputs": {"regex": "("}}, "structured_outputs", "unclosed group"),
    ({"structured_outputs": {"regex": "a", "choice": ["a"]}}, "structured_outputs", "exactly one"),
    ({"structured_outputs": {"pattern": "a"}}, "structured_outputs", "pattern"),
    ({"guided_regex": r"[^\s\S]"}, "guided_regex", "matches no output"),
    ({"guided_choice": []}, "guided_choice", "0 items"),
    ({"guided_choice": [f"label {i}" for i in range(10_000)]}, "guided_choice", "10000 items"),
    ({"guided_grammar": "root ::= missing"}, "guided_grammar", "missing"),
    ({"grammar": "start: (("}, "grammar", None),
    ({"guided_regex": "a", "guided_choice": ["a"]}, "guided_regex", "one constraint"),
])
def test_a_bad_constraint_is_a_400_naming_its_field(stories, fields, param, message):
    r = httpx.post(stories.url + "/v1/completions", timeout=120,
                   json={"prompt": "Once upon a time", "max_tokens": 8, **fields})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param, error
    if message is not None:
        assert message in error["message"], error
    assert stories.llm.stats()["blocks_used"] == 0
