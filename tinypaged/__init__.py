"""tinypaged: a small LLM inference engine built around PagedAttention."""
from .llm import LLM, RequestOutput
from .sampling import SamplingParams

__all__ = ["LLM", "RequestOutput", "SamplingParams"]
