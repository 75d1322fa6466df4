"""POST /v1/load_lora_adapter and /v1/unload_lora_adapter, as vLLM serves them: an
adapter folder loaded under a name (then a request runs it by naming it as its
model), or a name taken away (its running requests finish with it). Both answer
plain text, as vLLM's do; a refusal is an error body naming the problem, and the
server goes on serving."""
from __future__ import annotations

import asyncio

from fastapi.responses import PlainTextResponse

from .api_model import APIModel
from .engine_client import EngineClient
from .errors import APIError


class LoadLoRAAdapterRequest(APIModel):
    lora_name: str
    lora_path: str


class UnloadLoRAAdapterRequest(APIModel):
    lora_name: str
    lora_int_id: int | None = None  # (vLLM's; the name decides)


async def load_adapter(req: LoadLoRAAdapterRequest, client: EngineClient) -> PlainTextResponse:
    """The folder is read and checked in a thread (it can be tens of MB), then put in a
    slot between two steps."""
    client.check_alive()
    try:
        await asyncio.to_thread(client.llm.load_lora, req.lora_name, req.lora_path)
    except (ValueError, TypeError) as e:
        about_name = "already loaded" in str(e) or "name must" in str(e)
        raise APIError(400, str(e), param="lora_name" if about_name else "lora_path") from None
    return PlainTextResponse(f"Success: LoRA adapter '{req.lora_name}' added successfully.")


async def unload_adapter(req: UnloadLoRAAdapterRequest, client: EngineClient) -> PlainTextResponse:
    client.check_alive()
    try:
        await asyncio.to_thread(client.llm.unload_lora, req.lora_name)
    except KeyError:
        raise APIError(404, f"the LoRA adapter {req.lora_name!r} cannot be found",
                       param="lora_name", code="model_not_found") from None
    return PlainTextResponse(f"Success: LoRA adapter '{req.lora_name}' removed successfully.")


def adapter_cards(client: EngineClient, created: int) -> list[dict]:
    """/v1/models' entries for the loaded adapters (vLLM's: root the folder, parent the
    base model). Read as they stand, without waiting for the engine loop (a list of a
    dict's values is taken whole under the GIL)."""
    return [{"id": a.name, "object": "model", "created": created, "owned_by": "tinypaged",
             "root": a.path, "parent": client.model_name, "max_model_len": client.llm.max_model_len}
            for a in list(client.llm.engine.loras.loaded.values())]
