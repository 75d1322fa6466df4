"""The limits a grammar runs under, set here rather than left to llguidance's
defaults, and its errors told in one short line.

A grammar is user input: a 15-byte regex can ask the lexer for a million states, a
schema of many optional keys for rows of thousands of items. llguidance checks each
of these limits and puts the matcher in an error state, at compile time or at any
later token; GrammarFailed carries that to the request as a short message naming
the limit (llguidance's own message, with verbose errors, dumps the grammar and the
parser's state)."""
from __future__ import annotations

# llguidance's LLParserLimits, each named. llguidance's defaults but one: they admit every
# schema and grammar the tests and the clients tried, and bound the time of a step (fuel,
# items) and memory (lexer states, ~1-2 kB each). The lexer's fuel is a fifth of the
# default: with 1,000,000, a 15-byte regex, (a{1000}){1000}, spent 0.7 s of a core (and
# 190 MB) in the engine's step before failing, and a{100000} passed at 90 ms a token,
# which every request in the batch waits for; with 200,000 both fail within 0.1 s, and
# maxLength 65535, uuid, date-time, 64-hex patterns and 500-key objects still run
# (bench/NOTES.md, issue 31)
GRAMMAR_LIMITS = {
    "max_items_in_row": 2000,  # Earley items in one row (a schema's optional keys x ~4)
    "initial_lexer_fuel": 200_000,  # work building the lexer's expressions
    "step_lexer_fuel": 200_000,  # lexer work for one token's mask (~14k/ms)
    "step_max_items": 50_000,  # Earley items for one token's mask (~20k/ms)
    "max_lexer_states": 250_000,  # lexer states a grammar may build
    "max_grammar_size": 500_000,  # symbols in the grammar's productions
}

# words of llguidance's error messages -> the limit they report
_LIMIT_WORDS = (("too many expressions", "initial_lexer_fuel"),
                ("items in row", "max_items_in_row"), ("row has", "max_items_in_row"),
                ("too many items", "step_max_items"), ("fuel", "step_lexer_fuel"),
                ("lexer states", "max_lexer_states"), ("too many states", "max_lexer_states"),
                ("grammar size", "max_grammar_size"), ("grammar too large", "max_grammar_size"))
MAX_MESSAGE = 200  # characters of llguidance's message kept


# an object's optional properties at most: llguidance's Earley rows hold about 4 items per
# optional property, so past max_items_in_row / 4 the first key already fails, after a
# compile whose time grows with the square of their number (10,000: 11 s)
MAX_OPTIONAL_PROPERTIES = GRAMMAR_LIMITS["max_items_in_row"] // 4


def check_optional_properties(schema) -> None:
    """ValueError for an object schema (anywhere in schema) with more optional
    properties than a grammar can hold, before anything is compiled."""
    stack = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, list):
            stack += node
            continue
        if not isinstance(node, dict):
            continue
        properties = node.get("properties")
        if isinstance(properties, dict):
            required = node.get("required") if isinstance(node.get("required"), list) else []
            optional = len(set(properties) - set(map(str, required)))
            if optional > MAX_OPTIONAL_PROPERTIES:
                raise ValueError(f"an object with {optional:,} optional properties; at most "
                                 f"{MAX_OPTIONAL_PROPERTIES} (llguidance's limit max_items_in_row="
                                 f"{GRAMMAR_LIMITS['max_items_in_row']:,} holds about 4 items "
                                 f"a property)")
        stack += node.values()


class GrammarFailed(ValueError):
    """A grammar that does not compile, went over a limit, or can match nothing: the
    request's input is at fault (an HTTP 400), not the engine."""


def parser_limits(ll):
    """llguidance's LLParserLimits with GRAMMAR_LIMITS, and errors without the grammar."""
    return ll.LLParserLimits(**GRAMMAR_LIMITS, verbose_errors=False)


def error_line(error: str) -> str:
    """llguidance's message on one short line, with the limit it hit named."""
    lines = [line.strip() for line in error.strip().splitlines()
             if line.strip() and not line.strip().startswith("<non-verbose")]
    text = " ".join(lines) or "invalid"
    if text == "NoExtensionBias":  # no token can start the output
        return "matches no output at all"
    if len(text) > MAX_MESSAGE:
        text = text[:MAX_MESSAGE] + "..."
    lowered = text.lower()
    for words, limit in _LIMIT_WORDS:
        if words in lowered:
            return f"{text} (llguidance's limit {limit}={GRAMMAR_LIMITS[limit]:,})"
    return text
