"""POST /v1/embeddings in OpenAI's shape (as vLLM and llama.cpp serve it): `input` a
string, a list of strings, a list of token ids or a list of such lists;
`encoding_format` "float" or "base64" (little-endian float32 bytes, as OpenAI's
client decodes them); `dimensions` the model's own, or a shorter size it declares
(Pooling.shortened); `usage` the prompts' tokens. The vectors come from LLM.embed (the engine's
pooling: model/pooling.py)."""
from __future__ import annotations

import asyncio
import base64
from typing import Literal

import numpy as np
from pydantic import Field, ValidationInfo, field_validator

from .engine_client import EngineClient
from .errors import APIError
from .protocol import APIModel, TokenId


class EmbeddingRequest(APIModel):
    model: str | None = None
    input: str | list[str] | list[TokenId] | list[list[TokenId]]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(None, ge=1)
    user: str | None = None

    @field_validator("input", mode="before")
    @classmethod
    def _count_inputs(cls, value, info: ValidationInfo):
        """A batch is counted before any input in it is read (the server's limit)."""
        limit = (info.context or {}).get("max_prompts")
        if isinstance(value, list) and not value:
            raise ValueError("an empty list: give at least one text or token list")
        if limit is not None and isinstance(value, list) and len(value) > limit \
                and not isinstance(value[0], int):
            raise ValueError(f"{len(value)} inputs in one request; this server takes at most {limit}")
        return value


async def create_embeddings(req: EmbeddingRequest, client: EngineClient) -> dict:
    client.check_model(req.model)
    client.check_alive()
    llm = client.llm
    width = llm.config.hidden_size
    try:
        llm.pooling.shortened(np.zeros(width, np.float32), req.dimensions, width)
    except ValueError as e:
        raise APIError(400, str(e), param="dimensions") from None
    inputs = [req.input] if isinstance(req.input, str) or (req.input and isinstance(req.input[0], int)) \
        else req.input
    ids = await client.text_work.run(lambda: [_ids(x, client) for x in inputs],
                                     "tokenizing the input", "input")
    try:
        vectors = await asyncio.get_running_loop().run_in_executor(None, llm.embed, ids, req.dimensions)
    except (ValueError, TypeError) as e:
        raise APIError(400, str(e), param="input") from None
    data = [{"object": "embedding", "index": i, "embedding": _encoded(v, req.encoding_format)}
            for i, v in enumerate(vectors)]
    tokens = sum(map(len, ids))
    return {"object": "list", "data": data, "model": client.model_name,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}


def _ids(value, client: EngineClient) -> list[int]:
    if not isinstance(value, str):
        return list(value)
    if not value:
        raise APIError(400, "input holds an empty string: give at least one character",
                       param="input")
    try:
        return client.text.encode(value, max_model_len=client.llm.max_model_len)
    except (ValueError, TypeError) as e:
        raise APIError(400, str(e), param="input") from None


def _encoded(vector: np.ndarray, encoding_format: str):
    if encoding_format == "base64":
        return base64.b64encode(vector.astype("<f4").tobytes()).decode("ascii")
    return vector.tolist()
