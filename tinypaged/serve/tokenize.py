"""POST /tokenize and /detokenize, as vLLM serves them: a prompt (or a conversation,
through the chat template) to token ids, and token ids back to text."""
from __future__ import annotations

from pydantic import Field, model_validator

from .engine_client import EngineClient
from .errors import APIError
from .protocol import APIModel, ChatMessage, TokenId


class TokenizeRequest(APIModel):
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool = True  # for a prompt: the BOS a model's tokenizer adds
    add_generation_prompt: bool = True  # for messages: the assistant's turn opened

    @model_validator(mode="after")
    def _one_input(self):
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("give either prompt or messages")
        return self


class DetokenizeRequest(APIModel):
    model: str | None = None
    tokens: list[TokenId] = Field(max_length=1 << 20)


def tokenize(req: TokenizeRequest, client: EngineClient) -> dict:
    client.check_model(req.model)
    llm = client.llm
    try:
        if req.prompt is not None:
            ids = client.text.encode(req.prompt, add_special_tokens=req.add_special_tokens)
        else:
            ids = client.text.chat_ids([m.template_message() for m in req.messages],
                                       req.add_generation_prompt)
    except (ValueError, TypeError) as e:
        raise APIError(400, str(e), param="prompt" if req.prompt is not None else "messages") from None
    return {"count": len(ids), "max_model_len": llm.max_model_len, "tokens": ids,
            "token_strs": None}


def detokenize(req: DetokenizeRequest, client: EngineClient) -> dict:
    client.check_model(req.model)
    vocab = client.llm.config.vocab_size
    bad = [t for t in req.tokens if t >= vocab]
    if bad:
        raise APIError(400, f"token id {bad[0]} is out of range [0, {vocab})", param="tokens")
    return {"prompt": client.text.decode(req.tokens)}
