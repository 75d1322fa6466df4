"""A schema placed inside another (structured/embed.py) keeps what its pointers name:
its definitions moved to the outer root, references to its root and below it
rewritten; and the composed schema compiles to a grammar that means the same."""
import json

from tinypaged import LLM
from tinypaged.serve import tools
from tinypaged.structured import StructuredOutputs
from tinypaged.structured.embed import embedded

TREE = {"type": "object", "required": ["name"],
        "properties": {"name": {"type": "string"}, "child": {"$ref": "#"},
                       "tag": {"$ref": "#/definitions/Tag"},
                       "same": {"$ref": "#/properties/name"}},
        "definitions": {"Tag": {"enum": ["a", "b"]}, "Tags": {"type": "array",
                                                            "items": {"$ref": "#/$defs/Tag"}}}}


def test_pointers_follow_the_schema_to_its_new_place():
    definitions = {"other": {}}
    schema = embedded(json.loads(json.dumps(TREE)), "#/properties/x", "p_", definitions)
    assert "definitions" not in schema and set(definitions) == {"other", "p_Tag", "p_Tags"}
    props = schema["properties"]
    assert props["child"] == {"$ref": "#/properties/x"}
    assert props["tag"] == {"$ref": "#/$defs/p_Tag"}
    assert props["same"] == {"$ref": "#/properties/x/properties/name"}
    assert definitions["p_Tags"]["items"] == {"$ref": "#/$defs/p_Tag"}


def test_a_recursive_tool_compiles_and_holds(stories_dir):
    grammars = LLM(stories_dir).engine.grammars
    tool = {"type": "function", "function": {"name": "tree", "parameters": TREE}}
    schema = tools.json_layout_schema([tool], True, True, None)
    compiled = grammars.compile(StructuredOutputs(json=schema))
    call = '{"tool_calls":[{"name":"tree","arguments":%s}]}'
    assert compiled.accepts(call % '{"name":"a","child":{"name":"b","tag":"a"},"same":"c"}')
    assert not compiled.accepts(call % '{"name":"a","child":{"name":"b","tag":"c"}}')
    assert not compiled.accepts(call % '{"name":"a","child":{"tag":"a"}}')
