"""One JSON schema placed inside another. A schema refers to its own parts by JSON
pointers from its root ("#/$defs/Address", "#" for itself); Pydantic, and so the
OpenAI SDK, instructor and pydantic-ai, write every nested model that way. Put under
`properties.arguments` of a bigger schema, those pointers would name parts of the
bigger one, which are not there. So the embedded schema's definitions move to the
outer root under a prefix of their own, and its pointers are rewritten to match."""
from __future__ import annotations

_DEFINITIONS = ("$defs", "definitions")


def embedded(schema: dict, at: str, prefix: str, definitions: dict) -> dict:
    """schema (plain dicts and lists, changed in place) ready to sit at pointer `at`
    (e.g. "#/properties/response") of an outer schema: its top-level definitions are
    added to `definitions` (the outer root's $defs) as prefix + name, and every $ref
    to them, to its root or below its root is rewritten. Walked with a stack: a
    schema may nest deeper than Python's recursion."""
    own = {}
    for key in _DEFINITIONS:
        if isinstance(schema.get(key), dict):
            own.update(schema.pop(key))
    stack = [schema, *own.values()]
    while stack:
        node = stack.pop()
        if isinstance(node, list):
            stack += node
        elif isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str):
                node["$ref"] = _moved(ref, at, prefix)
            stack += [value for key, value in node.items() if key != "$ref"]
    for name, value in own.items():
        definitions[prefix + name] = value
    return schema


def _moved(ref: str, at: str, prefix: str) -> str:
    for key in _DEFINITIONS:
        if ref.startswith(f"#/{key}/"):
            return "#/$defs/" + prefix + ref[len(key) + 3:]
    if ref == "#":
        return at
    if ref.startswith("#/"):
        return at + ref[1:]
    return ref  # another document's: left as written
