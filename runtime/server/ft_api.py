"""ft's own endpoints beside the Ollama, OpenAI and Anthropic APIs.

POST /api/ft/vram {"model": NAME, "vram_gib": X}: a new VRAM budget for a model the server has
loaded on the GPU (`ft serve --device gpu`); its expert cache is resized before its next token,
no weight reloaded. Answers the budget and the cache's new size; 400 with the numbers when the
budget cannot hold one token's experts, or the model runs on the CPU.
"""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, StrictFloat, StrictInt


class VramBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str
    vram_gib: StrictFloat | StrictInt  # (not true/false or "8": JSON numbers only)


def make_router(backend: Any) -> APIRouter:
    router = APIRouter()
    set_vram = getattr(backend, "set_vram", None)
    if set_vram is None:  # a backend without elastic VRAM (tests' fakes): no endpoint
        return router

    @router.post("/api/ft/vram")
    async def api_vram(body: VramBody) -> dict[str, Any]:
        return await asyncio.to_thread(set_vram, body.model, body.vram_gib)

    return router
