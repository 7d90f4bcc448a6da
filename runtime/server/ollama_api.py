"""Ollama's REST API (docs/api.md of Ollama, and the `ollama` Python package's types) over the
model manager: /api/generate, /api/chat, /api/tags, /api/show, /api/pull, /api/create,
/api/delete, /api/copy, /api/ps, /api/version, and `/` ("Ollama is running").

Only translation lives here (the wire format is ollama_types.py). Errors are `{"error": "..."}`
with the status of the ServerError (the app's handlers render them); an error after streaming
began is one more line `{"error": "..."}`, which the `ollama` client raises as ResponseError.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

from . import streaming
from .ollama_types import (
    FOREVER,
    ChatBody,
    CopyBody,
    CreateBody,
    GenerateBody,
    ModelBody,
    PullBody,
    ShowBody,
    chat_chunk,
    chat_final,
    check_format,
    details,
    generate_chunk,
    generate_final,
    keep_alive,
    line,
    messages_in,
    model_info,
    now,
    parameters_text,
    think,
    timestamp,
)
from .protocol import BadRequest, ChatRequest, Event, GenerateRequest, NotImplementedByFt, ServerError

log = logging.getLogger(__name__)

PullFn = Callable[[str, Callable[[Any], None]], None]  # (name, report(event with status/total/completed))
CreateFn = Callable[[str, dict[str, Any]], str]  # (name, what the request says) -> the name it stored
NDJSON = "application/x-ndjson"
PULL_FIRST_EVENT_S = 2.0  # how long a streamed pull waits for its first event before the status is sent
UNSUPPORTED = {"/api/embed": "embeddings", "/api/embeddings": "embeddings", "/api/push": "pushing models"}


# ---- the router ----------------------------------------------------------------------------------

def make_router(backend: Any, *, pull: PullFn | None = None, create: CreateFn | None = None,
                version: str = "0.0.0") -> APIRouter:
    """Ollama's endpoints over `backend` (a runtime.server.backend.ModelManager); `pull` and
    `create` are ft's own (injected: the runtime does not import the manager)."""
    router = APIRouter(tags=["ollama"])

    @router.api_route("/", methods=["GET", "HEAD"], response_class=PlainTextResponse, include_in_schema=False)
    async def root() -> str:
        return "Ollama is running"

    @router.get("/api/version")
    async def api_version() -> dict[str, str]:
        return {"version": version}

    @router.post("/api/chat", responses={200: {"content": {NDJSON: {}}}})
    async def api_chat(body: ChatBody, request: Request) -> Response:
        check_format(body.format)
        ka = keep_alive(body.keep_alive)
        if not body.messages:
            return await _load_or_unload(body.model, ka, {"message": {"role": "assistant", "content": ""}})
        chat = ChatRequest(model=body.model, messages=messages_in(body.messages), tools=body.tools,
                           options=body.options or {}, think=think(body.think), keep_alive=ka, stream=body.stream,
                           continue_final=True)
        return await _respond(backend.chat(chat), request, body.model, body.stream, chat_chunk, chat_final)

    @router.post("/api/generate", responses={200: {"content": {NDJSON: {}}}})
    async def api_generate(body: GenerateBody, request: Request) -> Response:
        check_format(body.format)
        ka = keep_alive(body.keep_alive)
        if body.images:
            raise BadRequest("images: ft's models read text only")
        if body.template:
            raise BadRequest("template overrides are not supported per request; use TEMPLATE in a Modelfile")
        if body.context:
            raise BadRequest("context (deprecated) is not supported: send the conversation to /api/chat")
        if not body.prompt and not body.suffix:
            return await _load_or_unload(body.model, ka, {"response": ""})
        generate = GenerateRequest(model=body.model, prompt=body.prompt, system=body.system, raw=body.raw,
                                   suffix=body.suffix, options=body.options or {}, think=think(body.think),
                                   keep_alive=ka, stream=body.stream)
        return await _respond(backend.generate(generate), request, body.model, body.stream, generate_chunk,
                              generate_final)

    async def _load_or_unload(model: str, ka: float | None, empty: dict[str, Any]) -> JSONResponse:
        if ka == 0:
            await backend.unload(model)
            reason = "unload"
        else:
            await backend.load(model, ka)
            reason = "load"
        return JSONResponse({"model": model, "created_at": now(), **empty, "done_reason": reason, "done": True})

    async def _respond(events: AsyncIterator[Event], request: Request, model: str, stream: bool,
                       chunk: Callable[[Event], dict[str, Any]],
                       final: Callable[[list[Event]], dict[str, Any]]) -> Response:
        if not stream:
            collected = await streaming.collect(events, request)
            if collected is None:
                return Response(status_code=499)  # nobody is listening
            return JSONResponse({"model": model, "created_at": now(), **final(collected)})
        started = await streaming.start(events, request)
        if started is None:
            return Response(status_code=499)
        first, rest = started

        async def body() -> AsyncIterator[bytes]:
            yield line({"model": model, "created_at": now(), **chunk(first)})
            try:
                async for event in rest:
                    yield line({"model": model, "created_at": now(), **chunk(event)})
            except ServerError as e:
                yield line({"error": e.message})
            except Exception as e:  # a bug below: tell the client instead of cutting the stream
                log.exception("streaming %s failed", model)
                yield line({"error": f"internal error: {type(e).__name__}: {e}"})

        return StreamingResponse(body(), media_type=NDJSON)

    @router.get("/api/tags")
    async def api_tags() -> dict[str, Any]:
        infos = await asyncio.to_thread(backend.list_models)
        return {"models": [{"name": m.name, "model": m.name, "modified_at": timestamp(m.modified_at),
                            "size": m.size_bytes, "digest": m.digest,
                            "details": details(m.family, m.dtype, m.parameters)} for m in infos]}

    @router.post("/api/show")
    async def api_show(body: ShowBody) -> dict[str, Any]:
        info = await asyncio.to_thread(backend.show, body.target)
        c = info["config"]
        return {
            "modelfile": info["modelfile"],
            "parameters": parameters_text(info["parameters"]),
            "template": info["template"] or "",
            "system": info["system"] or "",
            "license": info["license"] or "",
            "details": details(c.get("family"), c.get("dtype"), c.get("num_params_total")),
            "model_info": model_info(c.get("family"), c),
            "capabilities": info["capabilities"],
            "messages": info["messages"],  # (its recipe's MESSAGEs, which start its conversations)
            "modified_at": timestamp(info["modified_at"]),
        }

    @router.delete("/api/delete")
    async def api_delete(body: ModelBody) -> Response:
        await backend.delete(body.target)
        return JSONResponse(None)

    @router.post("/api/copy")
    async def api_copy(body: CopyBody) -> Response:
        await backend.copy(body.source, body.destination)
        return JSONResponse(None)

    @router.get("/api/ps")
    async def api_ps() -> dict[str, Any]:
        models = []
        for s in backend.ps():
            models.append({
                "name": s.name, "model": s.name, "size": s.ram_bytes + s.vram_bytes, "digest": s.digest,
                "details": details(s.family, s.dtype, s.parameters),
                "expires_at": FOREVER if s.expires_at is None else timestamp(s.expires_at),
                "size_vram": s.vram_bytes, "context_length": s.context_length,
                "ft": {"ram_bytes": s.ram_bytes, "vram_bytes": s.vram_bytes, "expert_cache_bytes": s.expert_cache_bytes,
                       "kv_bytes": s.kv_bytes, "device": s.device, "processor": s.processor,
                       "num_threads": s.num_threads, "active_requests": s.active_requests,
                       "sessions": s.sessions, "max_sessions": s.max_sessions,
                       "parked_blocks": s.parked_blocks, "parked_bytes": s.parked_bytes,
                       "park_budget_bytes": s.park_budget_bytes, "park_hits": s.park_hits,
                       "park_hit_tokens": s.park_hit_tokens},
            })
        return {"models": models}

    @router.post("/api/create", responses={200: {"content": {NDJSON: {}}}})
    async def api_create(body: CreateBody) -> Response:
        name = body.target
        if create is None:
            raise NotImplementedByFt("this server cannot create models; run `ft create` on its machine")
        if body.files or body.adapters:
            raise BadRequest("creating a model from uploaded files or adapters is not supported by ft: pull the "
                             "checkpoint with `ft pull` on the server's machine and create FROM its name")
        if body.quantize:
            raise BadRequest(f"ft does not re-quantize a stored model ({body.quantize!r}): pull the quantized tag "
                             "of its recipe (`ft show NAME` lists them) and create FROM that")
        if not body.from_ and not body.modelfile:
            raise BadRequest("from is required: the stored model this one is made from")
        request = body.model_dump(exclude_none=True, exclude={"model", "name", "stream", "files", "adapters"})
        created = await asyncio.to_thread(create, name, request)
        statuses = [{"status": f"using model {body.from_ or 'in the Modelfile'}"}, {"status": "writing manifest"},
                    {"status": "success", "model": created}]
        if not body.stream:
            return JSONResponse(statuses[-1])
        return StreamingResponse(iter([line(s) for s in statuses]), media_type=NDJSON)

    @router.post("/api/pull", responses={200: {"content": {NDJSON: {}}}})
    async def api_pull(body: PullBody) -> Response:
        name = body.target
        if pull is None:
            raise NotImplementedByFt("this server cannot pull models; run `ft pull` on its machine")
        events = _pull_events(pull, name)
        if body.stream:
            # what the pull refuses at once (a bad name, an unknown model) is the response's status,
            # as in a non-streamed pull; a pull that reports nothing for a while still streams
            first: asyncio.Future[dict[str, Any]] = asyncio.ensure_future(anext(events))
            await asyncio.wait({first}, timeout=PULL_FIRST_EVENT_S)
            error = first.exception() if first.done() else None
            if error is not None and not isinstance(error, StopAsyncIteration):
                raise error

            async def stream() -> AsyncIterator[bytes]:
                try:
                    try:
                        yield line(await first)
                    except StopAsyncIteration:
                        return
                    async for event in events:
                        yield line(event)
                except ServerError as e:
                    yield line({"error": e.message})
            return StreamingResponse(stream(), media_type=NDJSON)
        async for _ in events:
            pass
        return JSONResponse({"status": "success"})

    for path, endpoint in (("/api/version", api_version), ("/api/tags", api_tags)):  # clients probe with HEAD
        router.add_api_route(path, endpoint, methods=["HEAD"], include_in_schema=False)
    for path, what in UNSUPPORTED.items():
        router.add_api_route(path, _unsupported(what), methods=["POST"], include_in_schema=False)

    return router


def _unsupported(what: str) -> Callable[[], Any]:
    async def unsupported() -> None:
        raise NotImplementedByFt(f"{what} is not supported by ft")
    return unsupported


async def _pull_events(pull: PullFn, name: str) -> AsyncIterator[dict[str, Any]]:
    """Run `pull` on its own thread; its progress events as Ollama's {status, total, completed}."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[Any] = asyncio.Queue()
    end = object()

    def put(item: Any) -> None:
        try:
            loop.call_soon_threadsafe(queue.put_nowait, item)
        except RuntimeError:  # the loop is gone; the pull still finishes and registers the model
            pass

    def report(event: Any) -> None:
        item = {"status": str(getattr(event, "status", event))}
        for key in ("total", "completed"):
            value = getattr(event, key, None)
            if value is not None:
                item[key] = int(value)
        put(item)

    def run() -> None:
        try:
            pull(name, report)
            put(end)
        except ServerError as e:
            put(e)
        except Exception as e:  # a pull that fails for a reason the injected function did not type
            put(ServerError(f"pull of {name} failed: {type(e).__name__}: {e}"))

    threading.Thread(target=run, name=f"ft-pull-{name}", daemon=True).start()
    last = None
    while True:
        item = await queue.get()
        if item is end:
            break
        if isinstance(item, ServerError):
            raise item
        last = item["status"]
        yield item
    if last != "success":
        yield {"status": "success"}
