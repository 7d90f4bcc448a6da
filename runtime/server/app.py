"""The HTTP app of `ft serve`: the Ollama API, and the OpenAI and Anthropic flavours when their
modules are present, over one backend; an optional API key; request bodies within the limits of
limits.py (size, JSON nesting); every error a JSON body in the flavour's own shape with a 4xx
status for anything the client got wrong (never a 500 for bad input).

runtime must not import ftpull, so pulling and creating are injected: `create_app(backend,
pull=fn, create=gn)` where `fn(name, report)` pulls `name` and calls `report(event)` with objects
carrying status / total / completed, and `gn(name, request)` stores a model as /api/create asks
(ftpull.serve.build_app passes ft's pull and create).
"""

from __future__ import annotations

import asyncio
import hmac
import importlib
import logging
import os
from collections.abc import Awaitable, Callable, MutableMapping
from contextlib import asynccontextmanager
from importlib import metadata
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from registry import Store

from . import limits, ollama_api
from .protocol import Backend, ServerError

log = logging.getLogger(__name__)

Scope = MutableMapping[str, Any]
ASGIApp = Callable[[Scope, Callable[[], Awaitable[Any]], Callable[[Any], Awaitable[None]]], Awaitable[None]]
FLAVOURS = ("openai_api", "openai_responses", "anthropic_api", "ft_api")  # optional modules with make_router(backend)
OPEN_PATHS = ("/",)  # answered without the API key: "is a server running?"
# Browser origins allowed by default, as Ollama allows them: pages served from this machine, and
# desktop and editor webviews (Electron, Tauri, VS Code). More with FT_ORIGINS (comma-separated;
# "*" for any), as OLLAMA_ORIGINS.
LOCAL_ORIGINS = (r"(https?://(localhost|127\.0\.0\.1|\[::1\]|0\.0\.0\.0)(:\d+)?"
                 r"|(app|file|tauri|vscode-webview|vscode-file)://.*)")


def extra_origins() -> list[str]:
    return [o.strip() for o in os.environ.get("FT_ORIGINS", "").split(",") if o.strip()]

_OPENAI_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                 404: "not_found_error", 503: "server_error"}
_ANTHROPIC_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                    404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 503: "overloaded_error"}


def ft_version() -> str:
    try:
        return metadata.version("ft")
    except metadata.PackageNotFoundError:
        return "0.0.0"


def error_body(path: str, status: int, message: str) -> dict[str, Any]:
    """An error as the flavour that owns `path` shapes it."""
    if path.startswith("/v1/messages"):
        kind = _ANTHROPIC_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
        return {"type": "error", "error": {"type": kind, "message": message}}
    if path.startswith("/v1/"):
        kind = _OPENAI_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
        return {"error": {"message": message, "type": kind, "param": None, "code": None}}
    return {"error": message}


def error_response(request: Request, status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(error_body(request.url.path, status, message), status_code=status, headers=headers)


def validation_message(errors: list[Any]) -> str:
    """One line naming the fields at fault (pydantic's errors), or what is wrong with the body."""
    parts = []
    for e in errors[:5]:
        loc = [str(p) for p in e.get("loc", ()) if p != "body"]
        kind = e.get("type", "")
        if kind == "json_invalid":
            return f"malformed JSON in the request body: {e.get('ctx', {}).get('error', e.get('msg'))}"
        if not loc and kind == "missing":
            return "the request needs a JSON object body"
        if not loc:
            parts.append(f"the request body must be a JSON object ({e.get('msg')})")
            continue
        parts.append(f"{'.'.join(loc)}: {e.get('msg')}")
    more = f" (and {len(errors) - 5} more)" if len(errors) > 5 else ""
    return "invalid request: " + "; ".join(parts) + more


class JSONBodies:
    """Ollama reads every /api/ body as JSON whatever its Content-Type (`curl -d` sends a form
    type); tell FastAPI so too."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"].startswith("/api/"):
            headers = [(k, v) for k, v in scope["headers"] if k != b"content-type"]
            scope = {**scope, "headers": [*headers, (b"content-type", b"application/json")]}
        await self.app(scope, receive, send)


class BodyLimits:
    """Every request body is read here first and refused if larger than MAX_BODY_BYTES (413) or
    nested deeper than MAX_JSON_DEPTH (400), before any JSON parser recurses into it; the app
    then receives the same bytes."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length", b"")
        if declared.isdigit() and int(declared) > limits.MAX_BODY_BYTES:
            await self._refuse(scope, receive, send, 413, limits.too_large(int(declared)))
            return
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client left: nobody to answer
                return
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > limits.MAX_BODY_BYTES:
                await self._refuse(scope, receive, send, 413, limits.too_large())
                return
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        # (a large body is scanned off the event loop, so other requests' tokens keep flowing)
        problem = limits.too_deep(body) if size < 1 << 20 else await asyncio.to_thread(limits.too_deep, body)
        if problem:
            await self._refuse(scope, receive, send, 400, problem)
            return
        replayed = False

        async def replay() -> Any:
            nonlocal replayed
            if replayed:
                return await receive()  # (http.disconnect, when the client leaves)
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)

    @staticmethod
    async def _refuse(scope: Scope, receive: Any, send: Any, status: int, message: str) -> None:
        await JSONResponse(error_body(scope["path"], status, message), status_code=status)(scope, receive, send)


class APIKey:
    """Requests must carry `Authorization: Bearer KEY` or `x-api-key: KEY` (Anthropic's header)."""

    def __init__(self, app: ASGIApp, key: str) -> None:
        self.app = app
        self.key = key.encode()

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS or self._allowed(scope):
            await self.app(scope, receive, send)
            return
        status, message = 401, "missing or wrong API key: send Authorization: Bearer <key> or x-api-key: <key>"
        response = JSONResponse(error_body(scope["path"], status, message), status_code=status,
                                headers={"WWW-Authenticate": "Bearer"})
        await response(scope, receive, send)

    def _allowed(self, scope: Scope) -> bool:
        headers = dict(scope["headers"])
        given = headers.get(b"x-api-key", b"")
        auth = headers.get(b"authorization", b"")
        if auth[:7].lower() == b"bearer ":
            given = auth[7:].strip()
        return bool(given) and hmac.compare_digest(given, self.key)


def _flavour_routers(backend: Backend) -> list[Any]:
    routers = []
    for name in FLAVOURS:
        try:
            module = importlib.import_module(f"{__package__}.{name}")
        except ModuleNotFoundError as e:
            if e.name != f"{__package__}.{name}":
                raise
            continue
        routers.append(module.make_router(backend))
    return routers


def create_app(backend: Any = None, *, store: Store | None = None, pull: ollama_api.PullFn | None = None,
               create: ollama_api.CreateFn | None = None, api_key: str | None = None,
               version: str | None = None) -> FastAPI:
    """The server app over `backend` (default: a ModelManager over `store`, default Store.default())."""
    if backend is None:
        from .backend import ModelManager

        backend = ModelManager(store or Store.default())
    version = version or ft_version()

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> Any:
        yield
        close = getattr(backend, "close", None)
        if close is not None:
            close()

    app = FastAPI(title="ft", version=version, lifespan=lifespan,
                  description="Ollama, OpenAI and Anthropic APIs over ft's Mixture-of-Experts runtime.")
    app.include_router(ollama_api.make_router(backend, pull=pull, create=create, version=version))
    for router in _flavour_routers(backend):
        app.include_router(router)

    @app.exception_handler(ServerError)
    async def server_error(request: Request, exc: ServerError) -> JSONResponse:
        return error_response(request, exc.status, exc.message)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response(request, 400, validation_message(list(exc.errors())))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        message = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
        if exc.status_code == 404 and message == "Not Found":
            message = f"no such endpoint: {request.method} {request.url.path}"
        elif exc.status_code == 400 and message == "There was an error parsing the body":
            message = "the request body cannot be read as JSON (not UTF-8 text?)"
        return error_response(request, exc.status_code, message, headers=getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return error_response(request, 500, f"internal error: {type(exc).__name__}: {exc}")

    app.add_middleware(JSONBodies)
    app.add_middleware(BodyLimits)  # (inside the key check: a client without the key is not read)
    if api_key:
        app.add_middleware(APIKey, key=api_key)
    # outermost: a browser's preflight is answered before the key is asked for
    app.add_middleware(CORSMiddleware, allow_origins=extra_origins(), allow_origin_regex=LOCAL_ORIGINS,
                       allow_methods=["*"], allow_headers=["*"])
    return app
