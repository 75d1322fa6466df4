"""tinypaged: a small LLM inference engine built around PagedAttention."""
from .config import EngineConfig
from .llm import LLM
from .outputs import CompletionOutput, RequestOutput
from .sampling import SamplingParams

__all__ = ["LLM", "SamplingParams", "RequestOutput", "CompletionOutput", "EngineConfig"]
