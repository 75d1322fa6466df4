"""LoRARequest: vLLM's way to name a LoRA adapter for a request (LLM.generate's
lora_request). The adapter is loaded from lora_path the first time its name is seen;
later requests run the loaded one. lora= with the name alone does the same for an
adapter loaded already (LLM(lora_modules=...), LLM.load_lora)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LoRARequest:
    lora_name: str
    lora_int_id: int = 0  # (vLLM's id; the name is what tinypaged goes by)
    lora_path: str = ""

    def __post_init__(self):
        if not isinstance(self.lora_name, str) or not self.lora_name:
            raise ValueError(f"lora_name must be a non-empty string, got {self.lora_name!r}")
