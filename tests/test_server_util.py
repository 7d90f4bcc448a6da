"""A live `ft serve` for the server tests (uvicorn on a free loopback port, in a thread), and unit
tests of the server's small parsers: keep_alive durations, FT_HOST, options, validation messages."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from ftpull.cli import _run
from ftpull.serve import create_for_server, format_ps, parse_host, pull_for_server, server_url
from registry import Store
from runtime.loading.registered import open_model
from runtime.server.app import create_app, validation_message
from runtime.server.backend import ModelManager
from runtime.server.models import request_options
from runtime.server.protocol import BadRequest, Busy
from runtime.server.scheduler import Admission, parse_keep_alive


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pulled_home(root: Path) -> Store:
    """A store at `root` holding the tiny model (pulled through the CLI, no network)."""
    import os

    old = os.environ.get("FT_HOME")
    os.environ["FT_HOME"] = str(root)
    try:
        _run(["pull", "tiny"])
    except SystemExit as e:
        assert not e.code
    finally:
        if old is None:
            os.environ.pop("FT_HOME", None)
        else:
            os.environ["FT_HOME"] = old
    return Store(root)


@contextmanager
def serving(app: Any) -> Iterator[str]:
    """`app` served by uvicorn on an ephemeral 127.0.0.1 port in a daemon thread; its base URL."""
    import uvicorn

    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "uvicorn did not start"
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


class LiveServer:
    """`create_app` over a ModelManager, served by uvicorn on 127.0.0.1 in a daemon thread."""

    def __init__(self, store: Store, *, api_key: str | None = None, **manager_options: Any) -> None:
        import uvicorn

        self.store = store
        self.manager = ModelManager(store, **manager_options)
        self.app = create_app(self.manager, pull=pull_for_server(store), create=create_for_server(store), api_key=api_key)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(self.app, host="127.0.0.1", port=self.port, log_level="warning",
                                timeout_graceful_shutdown=2)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, name="ft-test-server", daemon=True)

    def __enter__(self) -> LiveServer:
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the test server did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=15)

    def wait_for(self, condition: Any, timeout_s: float = 5.0) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if condition():
                return True
            time.sleep(0.02)
        return condition()


# ---- unit tests ------------------------------------------------------------------------------------

@pytest.mark.parametrize("value, seconds", [
    (300, 300.0), (0, 0.0), (-1, -1.0), (2.5, 2.5), ("5m", 300.0), ("1h30m", 5400.0), ("10s", 10.0),
    ("-1", -1.0), ("0", 0.0), ("-1m", -60.0), ("500ms", 0.5), ("1.5h", 5400.0), ("300", 300.0),
])
def test_keep_alive_durations(value: Any, seconds: float) -> None:
    assert parse_keep_alive(value) == pytest.approx(seconds)


@pytest.mark.parametrize("value", ["forever", "5 m", "m", "", "1e400", "--1", True, None, [], float("inf"), "5x"])
def test_keep_alive_refuses_other_forms(value: Any) -> None:
    with pytest.raises(ValueError, match="keep_alive"):
        parse_keep_alive(value)


@pytest.mark.parametrize("text, expected", [
    (None, ("127.0.0.1", 11435)), ("", ("127.0.0.1", 11435)), (":9000", ("127.0.0.1", 9000)),
    ("0.0.0.0", ("0.0.0.0", 11435)), ("localhost:8080", ("localhost", 8080)),
    ("http://10.1.2.3:7000", ("10.1.2.3", 7000)), ("[::1]:9000", ("::1", 9000)),
])
def test_ft_host(text: str | None, expected: tuple[str, int]) -> None:
    assert parse_host(text) == expected


def test_ft_host_urls() -> None:
    assert server_url("[::1]:9000") == "http://[::1]:9000"
    with pytest.raises(ValueError, match="port"):
        parse_host("localhost:http")


def test_admission_is_bounded_and_tickets_release_once() -> None:
    admission = Admission(2)
    a, b = admission.admit(), admission.admit()
    with pytest.raises(Busy, match="FT_MAX_QUEUE=2"):
        admission.admit()
    a.release()
    a.release()
    assert admission.waiting == 1
    admission.admit()
    b.release()
    assert admission.waiting == 1


def test_validation_messages_name_the_field() -> None:
    errors = [{"loc": ("body", "messages", 0, "content"), "msg": "Input should be a valid string", "type": "string_type"}]
    assert validation_message(errors) == "invalid request: messages.0.content: Input should be a valid string"
    assert "malformed JSON" in validation_message([{"loc": ("body", 1), "msg": "JSON decode error",
                                                    "type": "json_invalid", "ctx": {"error": "Expecting value"}}])
    assert "JSON object body" in validation_message([{"loc": ("body",), "msg": "Field required", "type": "missing"}])


def test_request_options(tmp_path_factory: pytest.TempPathFactory) -> None:
    store = pulled_home(tmp_path_factory.mktemp("ft_home"))
    model = open_model(store, "tiny")
    opts = request_options(model, {"num_predict": 5, "num_ctx": 128, "mirostat": 0, "top_k": None})
    assert opts.sampling.max_tokens == 5 and opts.num_ctx == 128
    assert opts.sampling.top_k == 20 and opts.sampling.seed == 0  # the recipe's PARAMETERs stay defaults
    for bad, name in (({"temperature": "hot"}, "temperature"), ({"num_predict": -5}, "max_tokens|num_predict"),
                      ({"bogus": 1}, "bogus"), ({"num_ctx": 0}, "num_ctx"), ({"num_thread": 10**6}, "num_thread")):
        with pytest.raises(BadRequest, match=name):
            request_options(model, bad)


def test_a_request_overrides_the_recipe_under_any_name_of_an_option(tmp_path_factory: pytest.TempPathFactory) -> None:
    """A Modelfile's num_predict and repeat_penalty against OpenAI's max_tokens (Anthropic's
    required max_tokens arrives so) and vLLM's repetition_penalty: the request's value wins, no
    "conflict"; two names for one option within a request still conflict."""
    store = pulled_home(tmp_path_factory.mktemp("ft_home"))
    model = open_model(store, "tiny")
    model.config.setdefault("parameters", {}).update(num_predict=64, repeat_penalty=1.05)
    opts = request_options(model, {"max_tokens": 5, "repetition_penalty": 1.1})
    assert opts.sampling.max_tokens == 5 and opts.sampling.repeat_penalty == 1.1
    assert request_options(model, {"max_completion_tokens": 7}).sampling.max_tokens == 7
    assert request_options(model, {}).sampling.max_tokens == 64  # the recipe's, where the request names none
    with pytest.raises(BadRequest, match="conflicts"):
        request_options(model, {"max_tokens": 5, "num_predict": 6})
    assert request_options(model, {"top_k": -1}).sampling.top_k == 0  # -1: no limit, as in vLLM and llama.cpp


def test_format_ps() -> None:
    row = {"name": "tiny:latest", "digest": "247cef76711169e3", "size": 10_000_000, "context_length": 2048,
           "expires_at": "2000-01-01T00:05:00Z", "ft": {"processor": "100% CPU", "kv_bytes": 4_000_000}}
    table = format_ps([row, {**row, "expires_at": "9999-12-31T23:59:59Z"}], now=946684800.0)
    lines = table.splitlines()
    assert lines[0].split() == ["NAME", "ID", "SIZE", "PROCESSOR", "CONTEXT", "KV", "CACHE", "UNTIL"]
    assert "247cef767111" in lines[1] and "100% CPU" in lines[1] and "5 minutes from now" in lines[1]
    assert lines[2].endswith("Forever")
    pooled = format_ps([{**row, "ft": {**row["ft"], "sessions": 2, "max_sessions": 4}}], now=946684800.0)
    assert "(2/4 sessions)" in pooled.splitlines()[1]
    parked = format_ps([{**row, "ft": {**row["ft"], "parked_blocks": 3, "parked_bytes": 3_000_000,
                                       "park_budget_bytes": 2_000_000_000, "park_hits": 2}}], now=946684800.0)
    assert "(+3 blocks parked, 3.0 MB of 2.0 GB, 2 hits)" in parked.splitlines()[1]
