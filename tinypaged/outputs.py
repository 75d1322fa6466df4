"""What generation returns: RequestOutput, with one CompletionOutput per sample."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class CompletionOutput:
    index: int  # which of the request's n samples
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None  # "stop" (EOS, stop token or string), "length", "abort"


@dataclass(slots=True)
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool = False

    # the first sample, for the common n = 1 case
    @property
    def text(self) -> str:
        return self.outputs[0].text

    @property
    def token_ids(self) -> list[int]:
        return self.outputs[0].token_ids

    @property
    def finish_reason(self) -> str | None:
        return self.outputs[0].finish_reason
