"""POST /v1/rerank (and /rerank) in the shape Jina's and Cohere's APIs use and vLLM and
llama.cpp serve: a query, documents (texts, or {"text": ...} objects), top_n, and
return_documents; the results ranked by relevance_score (LLM.score), each with its index
in the request."""
from __future__ import annotations

import asyncio
import uuid

from pydantic import Field

from .engine_client import EngineClient
from .errors import APIError
from .protocol import APIModel


class RerankDocument(APIModel):
    text: str


class RerankRequest(APIModel):
    model: str | None = None
    query: str
    documents: list[str | RerankDocument] = Field(min_length=1, max_length=1024)
    top_n: int | None = Field(None, ge=1)
    return_documents: bool = True
    instruction: str | None = None  # (Qwen3-Reranker's "Instruct"; None: its default)


async def create_rerank(req: RerankRequest, client: EngineClient) -> dict:
    client.check_model(req.model)
    client.check_alive()
    texts = [d if isinstance(d, str) else d.text for d in req.documents]
    llm = client.llm
    def work():  # (off the event loop: the scores, and the texts' tokens for usage)
        scores = llm.score(req.query, texts, req.instruction)
        return scores, sum(len(llm.tokenizer.encode(t)) for t in [req.query, *texts])
    try:
        scores, tokens = await asyncio.get_running_loop().run_in_executor(None, work)
    except (ValueError, TypeError) as e:
        raise APIError(400, str(e), param="documents") from None
    ranked = sorted(range(len(texts)), key=lambda i: -scores[i])[:req.top_n]
    results = [{"index": i, "relevance_score": scores[i],
                **({"document": {"text": texts[i]}} if req.return_documents else {})}
               for i in ranked]
    return {"id": f"rerank-{uuid.uuid4().hex}", "model": client.model_name,
            "usage": {"total_tokens": tokens}, "results": results}
