"""Objects closed by default. JSON Schema lets an object hold keys besides those it
declares unless it says `additionalProperties: false`; few schemas say it (OpenAI's
strict mode makes clients add it, most tool definitions omit it), and a small model
given the room adds keys (the same key again) until max_tokens. So an object schema
that declares `properties` and says nothing of other keys admits only those, each
once, as vLLM's default grammar backend does. `additionalProperties: true` (or a
schema), `patternProperties` or `unevaluatedProperties` keep an object open; so does
an object that declares no properties (any JSON object)."""
from __future__ import annotations

_SCHEMA_LISTS = ("anyOf", "oneOf", "prefixItems")
_SCHEMA_MAPS = ("properties", "$defs", "definitions", "patternProperties", "dependentSchemas")
_SCHEMAS = ("items", "additionalProperties", "unevaluatedProperties", "additionalItems", "not",
            "if", "then", "else", "contains", "propertyNames")
_OPENERS = ("additionalProperties", "patternProperties", "unevaluatedProperties")


def closed_objects(schema):
    """schema (a JSON schema as plain dicts and lists, changed in place and returned)
    with every object that declares properties and no rule for other keys closed. The
    parts of an allOf are left open: each describes the same object, and closing each
    to its own keys would leave their intersection nothing (their sub-schemas are
    closed as anywhere else). Walked with a stack: a schema may nest deeper than
    Python's recursion."""
    stack = [(schema, False)]
    while stack:
        node, in_all_of = stack.pop()
        if not isinstance(node, dict):
            continue
        if (not in_all_of and isinstance(node.get("properties"), dict)
                and not any(key in node for key in _OPENERS)):
            node["additionalProperties"] = False
        for key in _SCHEMA_MAPS:
            if isinstance(node.get(key), dict):
                stack += [(value, False) for value in node[key].values()]
        for key in _SCHEMA_LISTS:
            if isinstance(node.get(key), list):
                stack += [(value, False) for value in node[key]]
        if isinstance(node.get("allOf"), list):
            stack += [(value, True) for value in node["allOf"]]
        stack += [(node[key], False) for key in _SCHEMAS if key in node]
    return schema
