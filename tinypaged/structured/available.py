"""llguidance (the optional extra `structured`), imported when a request first asks
for structured output."""
from __future__ import annotations


class StructuredOutputsUnavailable(ValueError):
    """llguidance is not installed."""


def llguidance_module():
    try:
        import llguidance
        import llguidance.numpy  # noqa: F401 (the bit mask helpers)
    except ImportError:
        raise StructuredOutputsUnavailable(
            "structured outputs need llguidance, which is not installed: "
            "pip install 'tinypaged[structured]'") from None
    return llguidance
