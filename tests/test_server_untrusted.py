"""Untrusted input never crashes `ft serve` or slips past it: a model name outside the grammar (a
Unicode look-alike, a control character) gets a 400 with the grammar's message on every endpoint
that takes one, and nothing is written; a body nested past MAX_JSON_DEPTH gets a 400 naming the
limit on every endpoint that takes a JSON body, and one past MAX_BODY_BYTES a 413; the server
answers a normal request afterwards. Through httpx and the real ollama, openai and anthropic
clients, against a live server on the tiny model."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import ollama
import openai
import pytest

from registry import Store
from runtime.server.limits import MAX_BODY_BYTES, MAX_JSON_DEPTH, json_depth, too_deep
from tests.test_server_util import LiveServer, pulled_home

KELVIN = "\u212aelvin"  # lower() makes the Kelvin sign an ASCII k: /api/copy registered kelvin:latest
BAD_NAMES = [KELVIN, "\uff54\uff49\uff4e\uff59", "tiny\u200b", "../\x00x", "tiny\x00", "ti\x01ny", "tiny\u0085"]
CHAT = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    store: Store = pulled_home(tmp_path_factory.mktemp("ft_home"))
    with LiveServer(store) as live:
        yield live


def request(server: LiveServer, method: str, path: str, body: Any = None, content: bytes | None = None,
            **kwargs: Any) -> httpx.Response:
    args: dict[str, Any] = {"content": content} if content is not None else {"json": body}
    return httpx.request(method, server.url + path, timeout=60, **args, **kwargs)


def error_message(r: httpx.Response) -> str:
    error = r.json().get("error")
    return error if isinstance(error, str) else error["message"]  # Ollama's shape, or OpenAI's and Anthropic's


def _tree(store: Store) -> list[str]:
    return sorted(str(p.relative_to(store.root)) for p in store.manifests_dir.rglob("*"))


def name_requests(name: str) -> list[tuple[str, str, dict[str, Any]]]:
    """Every endpoint that takes a model name, with `name` in it."""
    return [
        ("POST", "/api/pull", {"model": name, "stream": False}),
        ("POST", "/api/pull", {"model": name}),  # streamed: the refusal is still the status
        ("POST", "/api/pull", {"name": name}),
        ("POST", "/api/copy", {"source": "tiny", "destination": name}),
        ("POST", "/api/copy", {"source": name, "destination": "elsewhere"}),
        ("DELETE", "/api/delete", {"model": name}),
        ("POST", "/api/show", {"model": name}),
        ("POST", "/api/chat", {"model": name, "messages": CHAT, "stream": False}),
        ("POST", "/api/chat", {"model": name}),  # load
        ("POST", "/api/generate", {"model": name, "prompt": "hi", "stream": False}),
        ("POST", "/api/generate", {"model": name, "keep_alive": 0}),  # unload
        ("POST", "/api/ft/vram", {"model": name, "vram_gib": 1}),
        ("POST", "/v1/chat/completions", {"model": name, "messages": CHAT}),
        ("POST", "/v1/completions", {"model": name, "prompt": "hi"}),
        ("POST", "/v1/messages", {"model": name, "max_tokens": 2, "messages": CHAT}),
        ("POST", "/v1/messages/count_tokens", {"model": name, "messages": CHAT}),
    ]


@pytest.mark.parametrize("name", BAD_NAMES, ids=ascii)
def test_every_endpoint_refuses_a_name_outside_the_grammar(server: LiveServer, name: str) -> None:
    before = _tree(server.store)
    for method, path, body in name_requests(name):
        r = request(server, method, path, body)
        assert r.status_code == 400, (path, body, r.status_code, r.text)
        message = error_message(r)
        assert "invalid model name" in message and "expected [host/][namespace/]model[:tag]" in message, (path, message)
    assert _tree(server.store) == before
    assert [m.name for m in server.manager.list_models()] == ["tiny:latest"]


def test_the_real_clients_get_a_bad_request(server: LiveServer) -> None:
    client = ollama.Client(host=server.url, timeout=60)
    for call in (lambda: client.copy("tiny", KELVIN), lambda: client.pull("../\x00x"),
                 lambda: client.pull(KELVIN, stream=False), lambda: client.show(KELVIN),
                 lambda: client.chat(model=KELVIN, messages=CHAT), lambda: client.delete(KELVIN)):
        with pytest.raises(ollama.ResponseError) as e:
            call()
        assert e.value.status_code == 400 and "invalid model name" in e.value.error
    with pytest.raises(ollama.ResponseError) as e:
        list(client.pull("../\x00x", stream=True))  # (the client raises on the status before reading a line)
    assert e.value.status_code == 400 and "NUL" in e.value.error and "embedded null byte" not in e.value.error

    with openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0) as oa, pytest.raises(
            openai.BadRequestError, match="U\\+212A KELVIN SIGN"):
        oa.chat.completions.create(model=KELVIN, messages=CHAT, max_tokens=2)  # type: ignore[arg-type]
    with anthropic.Anthropic(base_url=server.url, api_key="x", max_retries=0) as an, pytest.raises(
            anthropic.BadRequestError, match="invalid model name"):
        an.messages.create(model=KELVIN, max_tokens=2, messages=CHAT)  # type: ignore[arg-type]
    assert [m.name for m in server.manager.list_models()] == ["tiny:latest"]
    assert client.chat(model="tiny", messages=CHAT, options={"num_predict": 2}).done


# ---- nesting and size ----------------------------------------------------------------------------

def nested_object(depth: int) -> str:
    return '{"a":' * depth + "1" + "}" * depth


DEEP_ARRAY = b"[" * 10_000 + b"]" * 10_000
HEAD = '{"model": "tiny", "max_tokens": 2, "prompt": "x", '
DEEP_CONTENT = (HEAD + '"messages": [{"role": "user", "content": ' + nested_object(1000) + "}]}").encode()
DEEP_OPTIONS = (HEAD + '"messages": [{"role": "user", "content": "x"}], "options": ' + nested_object(1000) + "}").encode()


def json_endpoints(server: LiveServer) -> list[tuple[str, str]]:
    """(method, path) of every route of the app that takes a body (routers included without a
    prefix: FastAPI 0.165 keeps them as routers, older versions copy their routes in)."""
    found, routes = [], list(server.app.routes)
    while routes:
        route = routes.pop()
        if hasattr(route, "original_router"):
            routes.extend(route.original_router.routes)
            continue
        for method in sorted(getattr(route, "methods", None) or ()):
            if method in ("POST", "PUT", "PATCH", "DELETE") and "{" not in route.path:
                found.append((method, route.path))
    return sorted(found)


def test_the_json_endpoints_are_all_found(server: LiveServer) -> None:
    assert {("POST", "/api/chat"), ("POST", "/api/generate"), ("POST", "/api/pull"), ("DELETE", "/api/delete"),
            ("POST", "/api/copy"), ("POST", "/api/show"), ("POST", "/api/ft/vram"), ("POST", "/v1/chat/completions"),
            ("POST", "/v1/completions"), ("POST", "/v1/messages"),
            ("POST", "/v1/messages/count_tokens")} <= set(json_endpoints(server))


@pytest.mark.parametrize("body", [DEEP_ARRAY, DEEP_CONTENT, DEEP_OPTIONS], ids=["array", "content", "options"])
def test_deep_nesting_is_a_400_naming_the_limit_everywhere(server: LiveServer, body: bytes) -> None:
    for method, path in json_endpoints(server):
        r = request(server, method, path, content=body, headers={"Content-Type": "application/json"})
        assert r.status_code == 400, (path, r.status_code, r.text[:300])
        message = error_message(r)
        assert f"more than the {MAX_JSON_DEPTH} ft accepts" in message, (path, message)
    r = request(server, "POST", "/api/chat", {"model": "tiny", "messages": CHAT, "stream": False,
                                              "options": {"num_predict": 2}})
    assert r.status_code == 200 and r.json()["done"]


def test_json_inside_tool_call_arguments_is_held_to_the_same_depth(server: LiveServer) -> None:
    arguments = "[" * 5000
    for path in ("/api/chat", "/v1/chat/completions"):
        call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": arguments}}
        body = {"model": "tiny", "stream": False, "max_tokens": 2, "options": {"num_predict": 2},
                "messages": [*CHAT, {"role": "assistant", "content": "", "tool_calls": [call]}]}
        r = request(server, "POST", path, body)
        assert r.status_code == 400 and "arguments" in error_message(r) and "5000 levels" in error_message(r), r.text


def test_a_real_tool_schema_is_well_within_the_limit(server: LiveServer) -> None:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(20):  # deeper than any real tool's parameters
        schema = {"type": "object", "properties": {"x": schema}}
    tools = [{"type": "function", "function": {"name": "f", "description": "d", "parameters": schema}}]
    r = request(server, "POST", "/v1/chat/completions", {"model": "tiny", "messages": CHAT, "tools": tools,
                                                         "max_tokens": 2})
    assert r.status_code == 200, r.text


def test_a_body_past_the_size_limit_is_a_413(server: LiveServer) -> None:
    big = b" " * (MAX_BODY_BYTES + 1)
    r = request(server, "POST", "/api/chat", content=big)  # Content-Length says so: refused unread
    assert r.status_code == 413 and "larger than the 32 MiB" in error_message(r)

    def chunks() -> Iterator[bytes]:  # no Content-Length: counted as it arrives
        for _ in range(33):
            yield b" " * (1 << 20)

    r = request(server, "POST", "/v1/messages", content=chunks())
    assert r.status_code == 413 and r.json()["error"]["type"] == "request_too_large"
    assert request(server, "GET", "/api/tags").status_code == 200


def test_json_depth_scans_without_parsing() -> None:
    assert [json_depth(t) for t in (b"", b"7", b"[]", b"[[1], {}]", b'{"a": [{"b": "]]]]"}]}')] == [0, 0, 1, 2, 3]
    assert json_depth(b'["\\"[[[[", "\\\\", [[]]]') == 3  # brackets in strings, escaped quotes, escaped backslashes
    assert json_depth(DEEP_ARRAY) == 10_000 and json_depth(b"[" * 500) == 500  # unclosed counts too
    assert json_depth(json.dumps([[["\u00e9"]]]).encode("utf-16")) == 3  # json.loads reads UTF-16 too
    assert json_depth(nested_object(MAX_JSON_DEPTH)) == MAX_JSON_DEPTH and too_deep(nested_object(MAX_JSON_DEPTH)) is None
    assert "65 levels" in (too_deep(nested_object(MAX_JSON_DEPTH + 1)) or "")
