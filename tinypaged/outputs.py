"""What generation returns: RequestOutput, with one CompletionOutput per sample."""
from __future__ import annotations

from dataclasses import dataclass, field

# A sample the KV pool could no longer hold even with every other sequence preempted:
# it was cut short, like "length", but by memory. Raise kv_cache_memory (or
# num_blocks), or ask for fewer max_tokens. The server reports it as "length".
KV_CACHE_FULL = "kv_cache_full"


@dataclass(slots=True)
class TokenLogprobs:
    """One position's log-probabilities under the model (raw logits, before any
    penalty, bias or temperature): the chosen token's, and the k most likely."""
    token_id: int
    logprob: float
    top: list[tuple[int, float]] = field(default_factory=list)  # (token id, logprob), best first


@dataclass(slots=True)
class CompletionOutput:
    index: int  # which of the request's n samples
    text: str = ""  # a character cut short by the end of generation is left out;
    #                  token_ids keep all its bytes
    token_ids: list[int] = field(default_factory=list)
    # "stop" (EOS, stop token or string), "length" (max_tokens or max_model_len),
    # KV_CACHE_FULL, "abort", "error" (see RequestOutput.error)
    finish_reason: str | None = None
    logprobs: list[TokenLogprobs] | None = None  # per token of token_ids, when asked for
    cumulative_logprob: float | None = None  # sum of those logprobs, when asked for


@dataclass(slots=True)
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool = False
    # per prompt token when asked for; None for the first (nothing predicts it)
    prompt_logprobs: list[TokenLogprobs | None] | None = None
    error: Exception | None = None  # why the request failed (finish_reason "error")

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
