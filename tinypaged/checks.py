"""Argument checks shared by SamplingParams, EngineConfig and the LLM methods.

Each check returns the value in its plain Python type (a NumPy integer becomes an
int) or raises: TypeError when the type is wrong, ValueError when the value is
out of range, both naming the field and what is valid. `bool` is not a number
here, although Python lets True pass for 1: a True max_tokens is a mistake.
"""
from __future__ import annotations

import math
import numbers

import numpy as np


def describe(value) -> str:
    """A value for an error message: its repr (cut short) and its type."""
    text = repr(value)
    return f"{text[:60]}{'...' if len(text) > 60 else ''} ({type(value).__name__})"


def is_integer(value) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def integer(name: str, value, minimum: int | None = None, maximum: int | None = None) -> int:
    if not is_integer(value):
        raise TypeError(f"{name} must be an integer, got {describe(value)}")
    if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
        raise ValueError(f"{name}={value} must be {_range(minimum, maximum)}")
    return int(value)


def optional_integer(name: str, value, minimum: int | None = None,
                     maximum: int | None = None) -> int | None:
    return None if value is None else integer(name, value, minimum, maximum)


def number(name: str, value, minimum: float | None = None, maximum: float | None = None,
           *, above: float | None = None) -> float:
    """A finite real number in [minimum, maximum] (and > above, when given)."""
    if not isinstance(value, numbers.Real) or isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be a number, got {describe(value)}")
    if not math.isfinite(value):
        raise ValueError(f"{name}={value} must be a finite number")
    if ((above is not None and not value > above) or (minimum is not None and value < minimum)
            or (maximum is not None and value > maximum)):
        raise ValueError(f"{name}={value} must be {_range(minimum, maximum, above)}")
    return float(value)


def boolean(name: str, value) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be True or False, got {describe(value)}")
    return bool(value)


def one_of(name: str, value, choices: tuple) -> str:
    if not isinstance(value, str) or value not in choices:
        raise ValueError(f"{name}={value!r} is not one of {', '.join(map(repr, choices))}")
    return value


def text(name: str, value) -> str:
    """A str that is valid Unicode (encodable as UTF-8: no lone surrogates)."""
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str, got {describe(value)}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(f"{name} is not valid text: {value[e.start:e.end]!r} at character "
                         f"{e.start} is a lone surrogate (undecodable input?)") from None
    return value


def _range(minimum, maximum, above=None) -> str:
    low = f"({above}" if above is not None else f"[{minimum}" if minimum is not None else None
    if low is not None and maximum is not None:
        return f"in {low}, {maximum}]"
    if low is not None:
        return f"> {above}" if above is not None else f">= {minimum}"
    return f"<= {maximum}"
