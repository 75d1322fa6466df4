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
    rank: int = 0  # the chosen token's place by logprob (1: the most likely)

    def as_vllm(self, decode) -> "dict[int, Logprob]":
        """vLLM's form: {token id: Logprob} for the chosen token and the top k (the
        chosen one first); decode(token id) -> its text."""
        out = {self.token_id: Logprob(self.logprob, self.rank, decode(self.token_id))}
        for place, (token, logprob) in enumerate(self.top, 1):
            if token not in out:
                out[token] = Logprob(logprob, place, decode(token))
        return out


@dataclass(slots=True, frozen=True)
class Logprob:
    """One token's log-probability as vLLM hands it out."""
    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


@dataclass(slots=True)
class CompletionOutput:
    index: int  # which of the request's n samples
    text: str = ""  # a character cut short by the end of generation is left out;
    #                  token_ids keep all its bytes
    token_ids: list[int] = field(default_factory=list)
    # "stop" (EOS, stop token or string), "length" (max_tokens or max_model_len),
    # KV_CACHE_FULL, "abort", "error" (see RequestOutput.error)
    finish_reason: str | None = None
    token_logprobs: list[TokenLogprobs] | None = None  # per token of token_ids, when asked for
    cumulative_logprob: float | None = None  # sum of those logprobs, when asked for
    decode: object = field(default=None, repr=False, compare=False)  # token id -> its text
    embedding: object = field(default=None, repr=False)  # (H,) float32 of an embedding request

    @property
    def logprobs(self) -> "list[dict[int, Logprob]] | None":
        """vLLM's form: per token, {token id: Logprob} (built when read)."""
        if self.token_logprobs is None:
            return None
        return [entry.as_vllm(self.decode) for entry in self.token_logprobs]


@dataclass(slots=True)
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool = False
    # per prompt token when asked for; None for the first (nothing predicts it)
    prompt_token_logprobs: list[TokenLogprobs | None] | None = None
    error: Exception | None = None  # why the request failed (finish_reason "error")
    num_cached_tokens: int = 0  # prompt tokens found in the prefix cache on admission
    decode: object = field(default=None, repr=False, compare=False)  # token id -> its text
    embedding: object = field(default=None, repr=False)  # (H,) float32 of an embedding request

    @property
    def prompt_logprobs(self) -> "list[dict[int, Logprob] | None] | None":
        """vLLM's form: per prompt token, {token id: Logprob}; None for the first."""
        if self.prompt_token_logprobs is None:
            return None
        return [e.as_vllm(self.decode) if e is not None else None
                for e in self.prompt_token_logprobs]

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
