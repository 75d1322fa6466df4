"""Structured outputs: a request's output held to a JSON schema, a regex, a choice or
a grammar, by a token mask per step (llguidance computes it; the sampler applies it)."""
from .limits import GrammarFailed
from .params import StructuredOutputs

__all__ = ["GrammarFailed", "StructuredOutputs"]
