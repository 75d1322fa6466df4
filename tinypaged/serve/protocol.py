"""Request bodies of the OpenAI API as the official client sends them, with vLLM's
extensions (top_k, min_p, repetition_penalty, ignore_eos, stop_token_ids).

Strict types (a string is not a number) and ranges checked: whatever fails here is a
400 naming the field. Fields this server does not know are accepted and ignored, as
vLLM and llama-server do (OpenAI's SDKs and apps send metadata, store, service_tier,
...); app.read_body logs them at debug level. `sampling_params()` turns a valid body
into the engine's SamplingParams. The fields that constrain the output are in
constraints.py.
"""
from __future__ import annotations

import json
from typing import Annotated, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from ..sampling import MAX_INDEX, MAX_LOGPROBS, SamplingParams
from .api_model import APIModel
from .constraints import ConstraintFields
from .errors import shown

MAX_N = 128  # samples per prompt (the engine's max_num_seqs may be lower)
MAX_STOP = 16  # stop strings per request


TokenId = Annotated[int, Field(ge=0, le=MAX_INDEX)]  # every integer is bounded where parsed


class StreamOptions(APIModel):
    include_usage: bool = False


class SamplingFields(ConstraintFields):
    """The fields both endpoints share."""
    model: str | None = None
    temperature: float = Field(1.0, ge=0, le=2)
    top_p: float = Field(1.0, gt=0, le=1)
    n: int = Field(1, ge=1, le=MAX_N)
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    seed: int | None = Field(None, ge=-(1 << 63), lt=1 << 64)
    presence_penalty: float = Field(0.0, ge=-2, le=2)
    frequency_penalty: float = Field(0.0, ge=-2, le=2)
    logit_bias: dict[str, float] | None = None
    # vLLM's extensions
    top_k: int = Field(0, ge=-1, le=MAX_INDEX)  # 0 or -1: off
    min_p: float = Field(0.0, ge=0, le=1)
    repetition_penalty: float = Field(1.0, gt=0, le=10)
    ignore_eos: bool = False
    stop_token_ids: list[TokenId] | None = None
    include_stop_str_in_output: bool = False
    min_tokens: int = Field(0, ge=0, le=MAX_INDEX)
    skip_special_tokens: bool = True
    allowed_token_ids: list[TokenId] | None = Field(None, min_length=1)
    bad_words: list[str] | None = Field(None, max_length=MAX_STOP * 4)
    @field_validator("stop")
    @classmethod
    def _stop(cls, value):
        stops = [value] if isinstance(value, str) else (value or [])
        if len(stops) > MAX_STOP or not all(stops):
            raise ValueError(f"must be a non-empty string or a list of at most {MAX_STOP} "
                             f"non-empty strings")
        return value

    @field_validator("logit_bias")
    @classmethod
    def _logit_bias(cls, value):
        for token, bias in (value or {}).items():
            if not token.isdigit() or len(token) > 10:
                raise ValueError(f"key {shown(token)} is not a token id")
            if not -100 <= bias <= 100:
                raise ValueError(f"bias {bias} for token {token} is not in [-100, 100]")
        return value

    def sampling_params(self, max_tokens: int, logprobs: int | None,
                        prompt_logprobs: int | None = None) -> SamplingParams:
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        structured = self.constraint()
        return SamplingParams(
            max_tokens=max_tokens, temperature=self.temperature, top_p=self.top_p,
            top_k=max(self.top_k, 0), min_p=self.min_p,
            repetition_penalty=self.repetition_penalty,
            seed=None if self.seed is None else self.seed % (1 << 64),  # any int64 works
            n=self.n, stop=stop, stop_token_ids=list(self.stop_token_ids or []),
            ignore_eos=self.ignore_eos, presence_penalty=self.presence_penalty,
            frequency_penalty=self.frequency_penalty,
            logit_bias={int(t): b for t, b in (self.logit_bias or {}).items()},
            logprobs=logprobs, prompt_logprobs=prompt_logprobs, structured_outputs=structured,
            include_stop_str_in_output=self.include_stop_str_in_output,
            min_tokens=self.min_tokens, skip_special_tokens=self.skip_special_tokens,
            allowed_token_ids=self.allowed_token_ids, bad_words=list(self.bad_words or []))


class CompletionRequest(SamplingFields):
    prompt: str | list[str] | list[TokenId] | list[list[TokenId]]
    max_tokens: int | None = Field(16, ge=1, le=MAX_INDEX)  # OpenAI's default for completions
    logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    prompt_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)  # vLLM's
    echo: bool = False
    best_of: int | None = Field(None, ge=1, le=MAX_N)
    suffix: str | None = None

    @field_validator("prompt", mode="before")
    @classmethod
    def _count_prompts(cls, value, info: ValidationInfo):
        """A batch is counted before any prompt in it is read (the server's limit comes
        in the validation context)."""
        limit = (info.context or {}).get("max_prompts")
        if limit is not None and isinstance(value, list) and len(value) > limit \
                and value and not isinstance(value[0], int):
            raise ValueError(f"{len(value)} prompts in one request; this server takes at most "
                             f"{limit}")
        return value

    @field_validator("prompt")
    @classmethod
    def _prompt(cls, value):
        if isinstance(value, list) and (not value or any(isinstance(p, list) and not p
                                                         for p in value)):
            raise ValueError("must not be empty")
        return value

    def prompts(self) -> list[str | list[int]]:
        """One prompt, or a batch: a string, a list of strings, token ids, or lists of them."""
        if isinstance(self.prompt, str) or isinstance(self.prompt[0], int):
            return [self.prompt]
        return list(self.prompt)


class TextPart(APIModel):
    type: Literal["text"]
    text: str


class FunctionCall(APIModel):
    name: str
    arguments: str  # JSON text, as OpenAI sends it


class ToolCall(APIModel):
    """A call an assistant message made earlier in the conversation."""
    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(APIModel):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None  # None: an assistant's tool calls only
    name: str | None = None
    tool_calls: list[ToolCall] | None = None  # an assistant's
    tool_call_id: str | None = None  # a tool's answer: to which call

    @model_validator(mode="after")
    def _content_or_calls(self):
        if self.content is None and not (self.role == "assistant" and self.tool_calls):
            raise ValueError(f"a {self.role} message needs content")
        return self

    @field_validator("content", mode="before")
    @classmethod
    def _only_text_parts(cls, value):
        for i, part in enumerate(value if isinstance(value, list) else []):
            kind = part.get("type") if isinstance(part, dict) else None
            if isinstance(kind, str) and kind != "text":
                raise ValueError(f"part {i} is of type {shown(kind)}; this server takes only "
                                 f"'text' parts (the model reads text alone)")
        return value

    def text(self) -> str:
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        return "".join(part.text for part in self.content)

    def template_message(self) -> dict:
        """The message as chat templates take it, as transformers hands it to them:
        "developer" is OpenAI's newer name for "system"; a tool call's arguments are
        a dict (templates write them with tojson)."""
        message = {"role": "system" if self.role == "developer" else self.role,
                   "content": self.text()}
        if self.tool_calls:
            message["tool_calls"] = [
                {"id": c.id, "type": "function",
                 "function": {"name": c.function.name, "arguments": _arguments(c.function.arguments)}}
                for c in self.tool_calls]
        if self.tool_call_id is not None:
            message["tool_call_id"] = self.tool_call_id
        if self.name is not None:
            message["name"] = self.name
        return message


def _arguments(text: str):
    """A call's arguments as a dict where they are a JSON object, else the text."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return text
    return value if isinstance(value, dict) else text


class ToolFunction(APIModel):
    name: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    description: str | None = None
    parameters: dict | None = None  # a JSON schema of the arguments object
    strict: bool | None = None  # the schema is always enforced


class Tool(APIModel):
    type: Literal["function"]
    function: ToolFunction


class NamedFunction(APIModel):
    name: str


class NamedToolChoice(APIModel):
    type: Literal["function"]
    function: NamedFunction


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1, le=MAX_INDEX)  # None: up to the context length
    max_completion_tokens: int | None = Field(None, ge=1, le=MAX_INDEX)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    tools: list[Tool] | None = Field(None, max_length=128)
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None  # false: exactly one call; None: several where
    #   the chat template shows several in one turn (tools.shows_parallel_calls)

    def chat_messages(self) -> list[dict]:
        """The conversation as the chat template takes it ("developer" is OpenAI's
        newer name for "system")."""
        return [m.template_message() for m in self.messages]

    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None \
            else self.max_tokens
