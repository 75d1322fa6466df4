"""Engine outputs -> OpenAI response bodies and streaming chunks, for both endpoints.

A ChoiceDelta follows one choice (one sample of one prompt) through a stream of
cumulative snapshots and hands out only what is new since the last chunk.
"""
from __future__ import annotations

from ..outputs import KV_CACHE_FULL, CompletionOutput, RequestOutput, TokenLogprobs
from ..tokenizer import Tokenizer


def usage(outputs: list[RequestOutput]) -> dict:
    """Prompt tokens once per prompt; completion tokens of every sample; of the prompt
    tokens, those the prefix cache held (OpenAI's prompt_tokens_details.cached_tokens)."""
    prompt = sum(len(out.prompt_token_ids) for out in outputs)
    completion = sum(len(o.token_ids) for out in outputs for o in out.outputs)
    cached = sum(out.num_cached_tokens for out in outputs)
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached}}


def token_text(tokenizer: Tokenizer, token_id: int) -> str:
    return tokenizer.token_bytes(token_id).decode("utf-8", errors="replace")


class TextOffsets:
    """text_offset: where each token's text starts in a choice's text, counted as the
    engine's detokenizer writes that text (a "<s>" or a SentencePiece word's leading
    space at the very start take no characters), so that offsets only grow."""

    def __init__(self, tokenizer: Tokenizer, context: list[int], start: int, limit: int | None = None):
        """context: the tokens before (the prompt, for generated ones); start: the
        characters before the first token; limit: no offset past it (the echo's end)."""
        self.detok = tokenizer.detokenizer(context)
        self.chars, self.limit = start, limit

    def of(self, token_ids: list[int]) -> list[int]:
        offsets = []
        for token in token_ids:
            offsets.append(self.chars if self.limit is None else min(self.chars, self.limit))
            self.chars += len(self.detok.push(token))
        return offsets


def echo_offsets(tokenizer: Tokenizer, prompt_token_ids: list[int], echo: str) -> list[int]:
    """text_offset of an echoed prompt's tokens, within the echo."""
    return TextOffsets(tokenizer, [], 0, len(echo)).of(prompt_token_ids)


def completion_logprobs(tokenizer: Tokenizer, token_ids: list[int],
                        entries: list[TokenLogprobs | None], offsets: list[int]) -> dict:
    """The completions API's logprobs: parallel lists per token (text_offset: see
    TextOffsets)."""
    tokens = [token_text(tokenizer, t) for t in token_ids]
    return {"tokens": tokens,
            "token_logprobs": [e.logprob if e is not None else None for e in entries],
            "top_logprobs": [{token_text(tokenizer, t): lp for t, lp in e.top} if e is not None
                             else None for e in entries],
            "text_offset": offsets}


def chat_logprobs(tokenizer: Tokenizer, entries: list[TokenLogprobs]) -> dict:
    """The chat API's logprobs: one object per token, with its bytes and alternatives."""
    def one(token_id: int, logprob: float) -> dict:
        raw = tokenizer.token_bytes(token_id)
        return {"token": raw.decode("utf-8", errors="replace"), "logprob": logprob,
                "bytes": list(raw)}
    return {"content": [{**one(e.token_id, e.logprob),
                         "top_logprobs": [one(t, lp) for t, lp in e.top]} for e in entries]}


class ChoiceDelta:
    """What one choice has sent so far in a stream."""

    def __init__(self):
        self.chars = 0  # of text
        self.tokens = 0  # of token_ids (and logprobs)
        self.finished = False

    def take(self, sample: CompletionOutput) -> tuple[str, list[int], list[TokenLogprobs], str | None] | None:
        """(new text, new token ids, their logprobs, finish reason if it just finished),
        or None when nothing changed."""
        if self.finished:
            return None
        text, ids = sample.text[self.chars:], sample.token_ids[self.tokens:]
        logprobs = (sample.token_logprobs or [])[self.tokens:]
        finish = sample.finish_reason
        if not text and not ids and finish is None:
            return None
        self.chars, self.tokens = len(sample.text), len(sample.token_ids)
        self.finished = finish is not None
        return text, ids, logprobs, finish


def openai_finish_reason(reason: str | None) -> str | None:
    """The engine's reasons in OpenAI's words: a sequence the KV pool could no longer
    hold ("kv_cache_full") was cut for length. "abort" and "error" stay (vLLM's)."""
    return "length" if reason == KV_CACHE_FULL else reason


def completion_choice(index: int, text: str, logprobs: dict | None, finish: str | None) -> dict:
    return {"index": index, "text": text, "logprobs": logprobs,
            "finish_reason": openai_finish_reason(finish)}


def chat_choice(index: int, content: str | None, tool_calls: list[dict] | None,
                finish: str | None, logprobs: dict | None) -> dict:
    message = {"role": "assistant", "content": content}
    if tool_calls:
        message["tool_calls"] = tool_calls
    return {"index": index, "message": message, "logprobs": logprobs,
            "finish_reason": openai_finish_reason(finish)}


def chat_delta_choice(index: int, delta: dict, logprobs: dict | None, finish: str | None) -> dict:
    return {"index": index, "delta": delta, "logprobs": logprobs,
            "finish_reason": openai_finish_reason(finish)}


def envelope(kind: str, response_id: str, created: int, model: str, choices: list[dict],
             **extra) -> dict:
    """kind: text_completion, chat.completion or chat.completion.chunk."""
    return {"id": response_id, "object": kind, "created": created, "model": model,
            "choices": choices, **extra}


def vllm_prompt_logprobs(out: RequestOutput, k: int) -> list[dict | None]:
    """vLLM's prompt_logprobs: per prompt token, {"token id": {logprob, rank,
    decoded_token}} for it and its k most likely alternatives; None for the first."""
    entries = []
    for entry in out.prompt_token_logprobs or []:
        if entry is None:
            entries.append(None)
            continue
        entry = TokenLogprobs(entry.token_id, entry.logprob, entry.top[:k], entry.rank)
        entries.append({str(token): {"logprob": lp.logprob, "rank": lp.rank,
                                     "decoded_token": lp.decoded_token}
                        for token, lp in entry.as_vllm(out.decode).items()})
    return entries
