"""The limits a grammar runs under, set here rather than left to llguidance's
defaults, and its errors told in one short line.

A grammar is user input: a 15-byte regex can ask the lexer for a million states, a
schema of many optional keys for rows of thousands of items. llguidance checks each
of these limits and puts the matcher in an error state, at compile time or at any
later token; GrammarFailed carries that to the request as a short message naming
the limit (llguidance's own message, with verbose errors, dumps the grammar and the
parser's state)."""
from __future__ import annotations

# llguidance's LLParserLimits, each named; the values are llguidance's defaults, which
# admit every schema and grammar the tests and the clients tried use, and put a bound
# on the time of a step (fuel, items) and on memory (lexer states, ~1-2 kB each)
GRAMMAR_LIMITS = {
    "max_items_in_row": 2000,  # Earley items in one row (a schema's optional keys x ~4)
    "initial_lexer_fuel": 1_000_000,  # work building the lexer's expressions (~50k/ms)
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
