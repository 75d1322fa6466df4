"""StructuredOutputs: what a request's output must match (vLLM's names), checked, and
turned into one llguidance grammar text (grammar_text)."""
from __future__ import annotations

import json
from dataclasses import dataclass, field

from .. import checks
from .available import llguidance_module
from .closed import closed_objects
from .limits import check_optional_properties
from .number_bounds import bounded_numbers

MAX_CHOICES = 1024  # a label list longer than this is a grammar, not a choice
MAX_GRAMMAR_CHARS = 1 << 20  # a schema, regex or grammar of more than 1 MiB is refused
CONSTRAINT_KINDS = ("json", "regex", "choice", "grammar", "json_object")
# JSON without its optional whitespace ("," and ":"): a small model let loose on it tends
# to write newlines until max_tokens (SmolLM2 and stories260K did)
JSON_LAYOUT = {"whitespace_flexible": False}


@dataclass(slots=True)
class StructuredOutputs:
    """Exactly one of:
    json: a JSON schema (a dict, or its JSON text): the output is one JSON value valid
          against it, its objects closed where the schema leaves them open (closed.py);
    regex: the output matches the regular expression (Rust regex syntax), whole;
    choice: the output is one of these strings;
    grammar: a Lark grammar (llguidance's dialect) or a llama.cpp GBNF grammar;
    json_object: True: the output is any JSON object."""
    json: dict | str | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    _text: str = field(default="", init=False, repr=False, compare=False)

    def __post_init__(self):
        given = [k for k in CONSTRAINT_KINDS if getattr(self, k) not in (None, False)]
        if len(given) != 1:
            raise ValueError(f"structured_outputs needs exactly one of {', '.join(CONSTRAINT_KINDS)}; got "
                             f"{', '.join(given) if given else 'none'}")
        kind = given[0]
        if kind == "json":
            self.json = _schema(self.json)
        elif kind == "regex":
            self.regex = _bounded("regex", self.regex)
        elif kind == "choice":
            self.choice = _choices(self.choice)
        elif kind == "grammar":
            self.grammar = _bounded("grammar", self.grammar)
        else:
            self.json_object = checks.boolean("json_object", self.json_object)
        self._text = grammar_text(kind, getattr(self, kind))

    @property
    def kind(self) -> str:
        return next(k for k in CONSTRAINT_KINDS if getattr(self, k) not in (None, False))

    @property
    def text(self) -> str:
        """The llguidance grammar this stands for (the compile cache's key)."""
        return self._text


def _bounded(name: str, value) -> str:
    value = checks.text(name, value)
    if not value:
        raise ValueError(f"{name} is empty")
    if len(value) > MAX_GRAMMAR_CHARS:
        raise ValueError(f"{name} has {len(value)} characters; at most {MAX_GRAMMAR_CHARS}")
    return value


def _schema(value) -> dict:
    """A JSON schema as a dict of its own (a JSON text is parsed)."""
    if isinstance(value, str):
        try:
            value = json.loads(_bounded("json", value))
        except json.JSONDecodeError as e:
            raise ValueError(f"json schema is not valid JSON: {e}") from None
    if isinstance(value, bool):  # JSON Schema allows true (anything) and false (nothing)
        value = {} if value else {"not": {}}
    if not isinstance(value, dict):
        raise TypeError(f"json must be a JSON schema (a dict or its JSON text), got "
                        f"{checks.describe(value)}")
    text = json.dumps(value)  # also a deep copy, and a check that it is JSON at all
    if len(text) > MAX_GRAMMAR_CHARS:
        raise ValueError(f"json schema has {len(text)} characters; at most {MAX_GRAMMAR_CHARS}")
    schema = json.loads(text)
    check_optional_properties(schema)
    return closed_objects(schema)


def _choices(value) -> list[str]:
    if not isinstance(value, (list, tuple)):
        raise TypeError(f"choice must be a list of strings, got {checks.describe(value)}")
    if not 1 <= len(value) <= MAX_CHOICES:
        raise ValueError(f"choice has {len(value)} items; give 1 to {MAX_CHOICES} strings")
    value = [checks.text(f"choice item {i}", c) for i, c in enumerate(value)]
    if not all(value):
        raise ValueError("choice items must not be empty strings")
    return value


def grammar_text(kind: str, value) -> str:
    """The llguidance grammar (its JSON form) for one kind of constraint. Pure text work:
    llguidance's own helpers, which need no tokenizer, do the converting."""
    ll = llguidance_module()
    if kind in ("json", "json_object"):  # (numbers bounded as llama.cpp bounds them)
        schema = json.dumps(bounded_numbers(value)) if kind == "json" else '{"type": "object"}'
        return ll.LLMatcher.grammar_from_json_schema(schema, defaults=JSON_LAYOUT)
    if kind == "regex":
        return ll.LLMatcher.grammar_from_regex(value)
    if kind == "choice":  # a Lark alternative of JSON-quoted literals
        return ll.LLMatcher.grammar_from_lark("start: " + " | ".join(json.dumps(c) for c in value))
    from llguidance.gbnf_to_lark import any_to_lark
    try:  # llama.cpp's GBNF becomes Lark; Lark passes through
        value = any_to_lark(value)
    except Exception as e:
        raise ValueError(f"grammar: cannot read this GBNF grammar: {e}") from None
    return ll.LLMatcher.grammar_from_lark(value)
