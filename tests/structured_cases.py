"""Constraints of every kind, each with a check of its own written in Python (json,
re), so that a sample is held to what the user asked for, not only to llguidance's
say. The bounds keep every output short enough to finish within max_tokens."""
import json
import re

from tinypaged.structured import StructuredOutputs

PERSON = {"type": "object", "additionalProperties": False, "required": ["name", "age", "pet"],
          "properties": {"name": {"type": "string", "pattern": "^[A-Za-z ]{1,8}$"},
                         "age": {"type": "integer", "minimum": 0, "maximum": 120},
                         "pet": {"enum": ["cat", "dog", "none"]}}}


def valid_person(text: str) -> bool:
    value = json.loads(text)
    return (set(value) == {"name", "age", "pet"}
            and re.fullmatch(r"[A-Za-z ]{1,8}", value["name"]) is not None
            and type(value["age"]) is int and 0 <= value["age"] <= 120
            and value["pet"] in ("cat", "dog", "none"))


CODE = r"[a-z]{1,6}-[0-9]{1,3}"
LABELS = ["positive", "negative", "neutral", "mixed feelings"]
# GBNF as llama.cpp writes it: a short list of names
NAMES_GBNF = 'root ::= name (", " name){0,2} "."\nname ::= "Tim" | "Lily" | "Sam" | "Ben"'
NAMES = re.compile(r"(Tim|Lily|Sam|Ben)(, (Tim|Lily|Sam|Ben)){0,2}\.")

CASES = {
    "json": (StructuredOutputs(json=PERSON), valid_person),
    "regex": (StructuredOutputs(regex=CODE), lambda t: re.fullmatch(CODE, t) is not None),
    "choice": (StructuredOutputs(choice=LABELS), lambda t: t in LABELS),
    "gbnf": (StructuredOutputs(grammar=NAMES_GBNF), lambda t: NAMES.fullmatch(t) is not None),
}


def assert_all_valid(outputs, kind: str, engine) -> None:
    """Every sample finished by its grammar (not cut by max_tokens), passes the Python
    check of its kind, and is a whole match for llguidance too."""
    structured, check = CASES[kind]
    compiled = engine.grammars.compile(structured)
    samples = [c for out in outputs for c in out.outputs]
    for c in samples:
        assert c.finish_reason == "stop", (kind, c.text, c.finish_reason)
        assert check(c.text), (kind, c.text)
        assert compiled.accepts(c.text), (kind, c.text)
