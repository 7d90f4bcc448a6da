"""`ft serve` and the commands that talk to it (`ft ps`, `ft stop`, `ft run` reusing a server).

The server side: `build_app(store)` is runtime.server.app.create_app over a ModelManager, with
ft's pull injected (runtime must not import ftpull). The client side: a few small HTTP helpers
over the Ollama API (stdlib only), and `RemoteChat`, which `ft run`'s REPL drives exactly like a
local chat.

Environment: FT_HOST (where the server listens / is found, "host:port", ":port" or a URL;
default 127.0.0.1:11435, beside a real Ollama's 11434), FT_API_KEY (the key the server requires
and the clients send).
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from registry import InvalidNameError, ModelNotFoundError, RegistryError, Store, parse_name
from runtime.engine import Generation, GenerationStats
from runtime.server.backend import ModelManager, ModelTooLarge
from runtime.server.protocol import BadRequest, ModelNotFound, ServerError
from runtime.text.sampling import SamplingParams

from .client import (  # noqa: F401 - re-exported: the client half lived here
    DEFAULT_HOST,
    DEFAULT_PORT,
    PROBE_TIMEOUT_S,
    Client,
    NoServer,
    ServerAddressError,
    ServerReplyError,
    format_ps,
    parse_host,
    server_url,
)
from .events import PullEvent
from .fetch import PullError
from .hub import HubError
from .modelfile import PARAMETERS, ModelfileError, parse_modelfile, variant_modelfile
from .preflight import FitError
from .pull import create_from, pull
from .resolve import ResolveError
from .run import TurnRefused


class UpstreamError(ServerError):
    """The Hugging Face Hub (or another source) failed while pulling."""

    status = 502


# ---- the server --------------------------------------------------------------------------------

def pull_for_server(store: Store) -> Callable[[str, Callable[[PullEvent], None]], None]:
    """ft's pull as the server's /api/pull calls it, with ft's errors as HTTP errors."""

    def run(name: str, report: Callable[[PullEvent], None]) -> None:
        try:
            pull(name, store, report=report)
        except (ResolveError, KeyError) as e:
            raise ModelNotFound(str(e)) from None
        except (InvalidNameError, ModelfileError) as e:
            raise BadRequest(str(e)) from None
        except FitError as e:
            raise ModelTooLarge(str(e)) from None
        except HubError as e:
            raise UpstreamError(str(e)) from None
        except (PullError, RegistryError, OSError) as e:
            raise ServerError(str(e)) from None

    return run


def create_for_server(store: Store) -> Callable[[str, dict[str, Any]], str]:
    """ft's create as the server's /api/create calls it: the request written as the Modelfile it
    stands for (FROM, SYSTEM, TEMPLATE, PARAMETERs, MESSAGEs, LICENSE; or a Modelfile a client
    sent), then `ft create`'s own path; ft's errors as HTTP errors."""

    def run(name: str, request: dict[str, Any]) -> str:
        try:
            parsed = parse_modelfile(request.get("modelfile") or request_modelfile(request), name=parse_name(name).model)
            _check_stored_base(parsed.recipe().source, store)
            return create_from(parse_name(name), parsed, store).name.display
        except ModelNotFoundError as e:
            raise ModelNotFound(str(e)) from None
        except (InvalidNameError, ModelfileError, ValueError) as e:
            raise BadRequest(str(e)) from None
        except (PullError, RegistryError, OSError) as e:
            raise ServerError(str(e)) from None

    return run


def _check_stored_base(source: Any, store: Store) -> None:
    """Over the API a model is made FROM a stored one only: not from a path on the server's disk,
    nor by downloading (a client pulls first, with /api/pull)."""
    stored = source.scheme == "local" and source.model_name is not None and not os.path.exists(source.path or "")
    if not stored:
        raise BadRequest(f"/api/create makes a model FROM a stored one, not {source.scheme}:{source.path or ''}: pull "
                         "it first (/api/pull) and create FROM its name")
    if not store.has_model(parse_name(source.model_name)):
        raise ModelNotFound(f"model {source.model_name!r} not found; pull it first (/api/pull)")


def request_modelfile(request: dict[str, Any]) -> str:
    """The Modelfile an /api/create request's fields say."""
    license_text = request.get("license")
    return variant_modelfile(request["from_"], system=request.get("system"), template=request.get("template"),
                             parameters=request.get("parameters"), messages=request.get("messages") or (),
                             license="\n".join(license_text) if isinstance(license_text, list) else license_text)


def build_app(store: Store, *, api_key: str | None = None, **manager_options: Any) -> Any:
    """The `ft serve` app over `store`."""
    from runtime.server.app import create_app

    return create_app(ModelManager(store, **manager_options), pull=pull_for_server(store),
                      create=create_for_server(store), api_key=api_key)


class PortInUse(OSError):
    """The address `ft serve` was to listen on is taken (or not ours to bind)."""


def bind(host: str, port: int) -> socket.socket:
    """The server's socket, bound now, so that a taken port is said before "listening on" is."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # (as uvicorn: a restart right after a stop)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise PortInUse(f"cannot listen on {host}:{port}: {e.strerror or e}; another server (an ft serve, an "
                        "ollama?) may hold it: stop it, or pick another address with --port or FT_HOST=host:port") \
            from None
    return sock


def serve(app: Any, sock: socket.socket, *, log_level: str = "info") -> None:
    """Run `app` (from build_app) on the bound `sock` in the foreground until interrupted."""
    import uvicorn

    server = uvicorn.Server(uvicorn.Config(app, log_level=log_level, timeout_graceful_shutdown=5))
    try:
        server.run(sockets=[sock])
    except KeyboardInterrupt:  # Ctrl-C, re-raised by uvicorn once it has shut down (as uvicorn.run takes it)
        pass


@dataclass
class RemoteChat:
    """`ft run` against a server: the same surface as ftpull.run.Chat (ask, clear, options, system)."""

    client: Client
    model: str
    options: dict[str, Any]
    system: str | None = None
    messages: list[dict[str, str]] = field(default_factory=list)
    last_load_seconds: float = 0.0  # the server's load_duration of the last answer

    def params(self) -> SamplingParams:
        return SamplingParams.from_options(self.options)

    def shown_parameters(self) -> dict[str, Any]:
        """What /show parameters prints: the model's defaults, as the server applies them (its
        /api/show lines), with this chat's settings over them; as a local chat shows them."""
        defaults: dict[str, Any] = {}
        try:
            shown = (self.client.post("/api/show", {"model": self.model}) or {}).get("parameters", "")
        except (NoServer, ServerReplyError):  # the chat goes on; the next question will say what is wrong
            shown = ""
        for line in shown.splitlines():
            key, _, text = line.strip().partition(" ")
            try:
                value = json.loads(text.strip())
            except ValueError:
                value = text.strip()
            if key == "stop":
                defaults["stop"] = (*defaults.get("stop", ()), value)
            elif key and key != "num_ctx":  # (a load option: a local chat does not list it either)
                defaults[key] = value
        return {**defaults, **self.options}

    def model_sections(self) -> dict[str, str]:
        """What /show info, modelfile, template, license and system print, from the server's
        /api/show (the system message: this chat's, where /set system gave one). ValueError
        where the server cannot say."""
        try:
            shown = self.client.post("/api/show", {"model": self.model}) or {}
        except (NoServer, ServerReplyError) as e:
            raise ValueError(f"the server could not show {self.model}: {e}") from None
        details, about = shown.get("details") or {}, shown.get("model_info") or {}
        arch = about.get("general.architecture", "")
        rows = [("architecture", arch), ("parameters", details.get("parameter_size")),
                *((key.replace("_", " "), about.get(f"{arch}.{key}")) for key in
                  ("context_length", "embedding_length", "block_count", "expert_count", "expert_used_count")),
                ("dtype", details.get("quantization_level"))]
        info = "\n".join(["  Model", *(f"    {k:<20}{v}" for k, v in rows if v not in (None, ""))])
        return {"info": info, "modelfile": shown.get("modelfile") or "", "template": shown.get("template") or "",
                "license": shown.get("license") or "", "system": self.system or shown.get("system") or ""}

    def load(self, name: str) -> list[dict[str, str]]:
        """/load through the server: `name` loaded there and this chat switched to it, its
        conversation and /set system dropped, its /set parameters kept (as a local /load). The
        server starts each of its conversations with its MESSAGEs, returned here to be shown.
        ValueError where the server cannot load it (not stored there: its message says so)."""
        try:
            shown = self.client.post("/api/show", {"model": name}) or {}
            self.client.post("/api/generate", {"model": name})  # an empty prompt loads it (Ollama's way)
        except (NoServer, ServerReplyError) as e:
            raise ValueError(f"the server could not load {name}: {e}") from None
        self.model, self.system, self.messages = name, None, []
        return [m for m in shown.get("messages") or () if isinstance(m, dict)]

    def save(self, name: str) -> str:
        """/save through the server: the chat stored there as a model FROM this one (its system
        prompt, /set parameters and the messages so far), as a local /save writes it; the name
        the server stored. ValueError where it could not."""
        body = {"model": name, "from": self.model, "system": self.system, "stream": False,
                "parameters": {k: v for k, v in self.options.items() if k in PARAMETERS} or None,
                "messages": self.messages or None}
        try:
            reply = self.client.post("/api/create", {k: v for k, v in body.items() if v is not None}) or {}
        except (NoServer, ServerReplyError) as e:
            raise ValueError(f"the server could not create {name}: {e}") from None
        return str(reply.get("model") or name)

    def ask(self, text: str, on_text: Callable[[str], None]) -> Generation:
        history = ([{"role": "system", "content": self.system}] if self.system else []) + self.messages
        body = {"model": self.model, "messages": [*history, {"role": "user", "content": text}],
                "options": self.options, "stream": True}
        pieces: list[str] = []
        final: dict[str, Any] = {}
        try:
            for chunk in self.client.stream("/api/chat", body):
                piece = (chunk.get("message") or {}).get("content") or ""
                if piece:
                    pieces.append(piece)
                    on_text(piece)
                if chunk.get("done"):
                    final = chunk
        except ServerReplyError as e:
            if e.status == 400:  # refused before any output (it does not fit the context): the chat goes on
                raise TurnRefused(str(e)) from None
            raise
        answer = "".join(pieces)
        self.messages += [{"role": "user", "content": text}, {"role": "assistant", "content": answer}]
        stats = GenerationStats(prompt_tokens=final.get("prompt_eval_count", 0),
                                prompt_seconds=final.get("prompt_eval_duration", 0) / 1e9,
                                eval_tokens=final.get("eval_count", 0), eval_seconds=final.get("eval_duration", 0) / 1e9)
        self.last_load_seconds = final.get("load_duration", 0) / 1e9
        return Generation(answer, [], final.get("done_reason", "stop"), stats)

    def clear(self) -> None:
        self.messages.clear()
