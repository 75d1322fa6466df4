"""Numbers a JSON schema leaves unbounded, bounded as llama.cpp bounds them: without
a bound, a sampled integer or number can run on digit after digit (at temperature 1
a small model did in 3 of 16 seeds) until max_tokens cuts it off.

An integer without a minimum (or maximum) gets -(10^16 - 1) (or 10^16 - 1): at most 16
digits, llama.cpp's integral part. A number gets -10^16 and 10^16 the same way, and,
without a multipleOf, a multipleOf of 10^-10: at most 10 digits after the point (the
finest grid llguidance takes exactly; llama.cpp allows 16) and no exponent. A bound
or multipleOf the schema gives is kept as it is.
"""
from __future__ import annotations

INTEGER_LIMIT = 10 ** 16 - 1  # 16 digits
NUMBER_LIMIT = 1e16
NUMBER_GRID = 1e-10  # (finer grids fail in llguidance: "too many digits")
DATA_KEYS = {"const", "enum", "default", "examples"}  # values there are data, not schemas


def bounded_numbers(schema):
    """The schema (a JSON value) with its unbounded integers and numbers bounded
    (above); a copy, the given schema left as it is."""
    if isinstance(schema, list):
        return [bounded_numbers(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: value if key in DATA_KEYS else bounded_numbers(value)
           for key, value in schema.items()}
    types = out.get("type")
    types = set(types) if isinstance(types, list) else {types}
    if "integer" in types or "number" in types:
        limit = INTEGER_LIMIT if "number" not in types else NUMBER_LIMIT
        if "minimum" not in out and "exclusiveMinimum" not in out:
            out["minimum"] = -limit
        if "maximum" not in out and "exclusiveMaximum" not in out:
            out["maximum"] = limit
        if "number" in types and "multipleOf" not in out:
            out["multipleOf"] = NUMBER_GRID
    return out
