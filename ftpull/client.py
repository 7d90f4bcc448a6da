"""The client side of `ft serve`: small HTTP helpers over its Ollama API (stdlib only, so the
commands that only talk to a server import nothing heavy), and where the server is found.

Environment: FT_HOST (where the server listens / is found, "host:port", ":port" or a URL;
default 127.0.0.1:11435, beside a real Ollama's 11434), FT_API_KEY (the key the server requires
and the clients send).
"""

from __future__ import annotations

import http.client
import json
import os
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 11435
PROBE_TIMEOUT_S = 0.5


class NoServer(Exception):
    """No ft server answers at the address; the message says how to start one."""


class ServerReplyError(Exception):
    """The server answered with an error; `status` is its HTTP status."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class ServerAddressError(ValueError):
    """FT_HOST names no address a server can be reached at or listen on."""


def parse_host(text: str | None) -> tuple[str, int]:
    """(host, port) from FT_HOST-style text: "host:port", ":port", "host", "http://host:port"."""
    text = (text or "").strip()
    if not text:
        return DEFAULT_HOST, DEFAULT_PORT
    parts = urlsplit(text if "://" in text else f"http://{text}")
    try:
        port = parts.port
    except ValueError:
        raise ServerAddressError(f"FT_HOST={text!r}: the port must be a number in 0-65535") from None
    return parts.hostname or DEFAULT_HOST, port if port is not None else DEFAULT_PORT


def server_url(host: str | None = None) -> str:
    address, port = parse_host(host if host is not None else os.environ.get("FT_HOST"))
    if ":" in address:  # IPv6
        address = f"[{address}]"
    return f"http://{address}:{port}"


# ---- the client --------------------------------------------------------------------------------

class Client:
    """The Ollama API of a running ft server, over urllib."""

    def __init__(self, url: str | None = None, api_key: str | None = None, timeout_s: float = 600.0) -> None:
        self.url = (url or server_url()).rstrip("/")
        self.api_key = api_key if api_key is not None else os.environ.get("FT_API_KEY")
        self.timeout_s = timeout_s

    def _open(self, method: str, path: str, body: Any = None, timeout_s: float | None = None) -> Any:
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.url + path, data=data, method=method, headers=headers)
        try:
            return urllib.request.urlopen(request, timeout=timeout_s or self.timeout_s)
        except urllib.error.HTTPError as e:
            raw = e.read().decode(errors="replace")
            try:
                message = json.loads(raw).get("error", raw)
            except (ValueError, AttributeError):
                message = raw
            message = message if isinstance(message, str) else json.dumps(message)
            if e.code == 401:  # a server started with --api-key
                message += ("; set FT_API_KEY to the key that server was started with" if not self.api_key
                            else "; FT_API_KEY is not the key that server was started with")
            raise ServerReplyError(e.code, message) from None
        except (TimeoutError, urllib.error.URLError, ConnectionError) as e:
            reason = getattr(e, "reason", e)
            raise NoServer(f"no ft server is running at {self.url} ({reason}); start one with `ft serve`"
                           " (FT_HOST sets the address)") from None

    def running(self) -> bool:
        """Whether an Ollama-compatible server answers at the address (quickly)."""
        try:
            with self._open("GET", "/", timeout_s=PROBE_TIMEOUT_S) as response:
                return b"Ollama is running" in response.read(64)
        except (NoServer, ServerReplyError, OSError, http.client.HTTPException):  # (something else on the port)
            return False

    def get(self, path: str) -> Any:
        with self._open("GET", path) as response:
            return json.loads(response.read() or b"null")

    def post(self, path: str, body: Any) -> Any:
        with self._open("POST", path, body) as response:
            return json.loads(response.read() or b"null")

    def stream(self, path: str, body: Any) -> Iterator[dict[str, Any]]:
        """The NDJSON objects of a streamed reply; ServerReplyError for an in-band error."""
        with self._open("POST", path, body) as response:
            for raw in response:
                if not raw.strip():
                    continue
                item = json.loads(raw)
                if "error" in item:
                    raise ServerReplyError(500, item["error"])
                yield item


def format_ps(models: list[dict[str, Any]], now: float | None = None) -> str:
    """`ft ps`: Ollama's columns, plus ft's memory split."""
    from datetime import datetime

    from .show import human_bytes

    now = time.time() if now is None else now
    header = ("NAME", "ID", "SIZE", "PROCESSOR", "CONTEXT", "KV CACHE", "UNTIL")
    rows = [header]
    for m in models:
        ft = m.get("ft") or {}
        until = "Forever"
        expires = m.get("expires_at")
        if expires and not expires.startswith("9999"):
            left = datetime.fromisoformat(expires.replace("Z", "+00:00")).timestamp() - now
            until = "Stopping..." if left <= 0 else f"{int(left // 60)} minutes from now" if left >= 120 else \
                f"{int(left)} seconds from now"
        kv = human_bytes(ft.get("kv_bytes", 0))
        if ft.get("max_sessions", 1) > 1:  # a few conversations' states kept at once
            kv += f" ({ft.get('sessions', 1)}/{ft['max_sessions']} sessions)"
        if ft.get("park_budget_bytes"):  # prefix blocks in host memory (a GPU model's second tier)
            kv += (f" (+{ft.get('parked_blocks', 0)} blocks parked, {human_bytes(ft.get('parked_bytes', 0))}"
                   f" of {human_bytes(ft['park_budget_bytes'])}, {ft.get('park_hits', 0)} hits)")
        rows.append((m["name"], m.get("digest", "")[:12], human_bytes(m.get("size", 0)),
                     ft.get("processor", "100% CPU"), str(m.get("context_length", "")), kv, until))
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    return "\n".join("    ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows)
