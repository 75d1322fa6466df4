"""tinypaged: a small LLM inference engine built around PagedAttention."""
__version__ = "0.1.0"

from .config import EngineConfig
from .llm import LLM
from .engine.engine_loop import EngineDeadError
from .lora_request import LoRARequest
from .outputs import CompletionOutput, RequestOutput, TokenLogprobs
from .request_handle import RequestHandle
from .sampling import SamplingParams
from .structured import StructuredOutputs

__all__ = ["LLM", "SamplingParams", "RequestOutput", "CompletionOutput", "TokenLogprobs",
           "RequestHandle", "EngineConfig", "EngineDeadError", "StructuredOutputs",
           "LoRARequest"]
