"""Fuzzing the Ollama endpoints with hypothesis: whatever the body, the server answers with a
status below 500, a JSON error naming the problem for 4xx, and stays up. Bounded: a few hundred
requests in well under a minute; every generation is capped at 2 tokens."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from registry import Store
from tests.test_server_util import LiveServer, pulled_home

EXAMPLES = 100
SETTINGS = settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

scalars = (st.none() | st.booleans() | st.integers(-(2**70), 2**70)
           | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=12))
json_values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3)
                           | st.dictionaries(st.text(max_size=6), inner, max_size=3), max_leaves=6)


def mostly(good: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """`good` seven times in eight, any JSON value otherwise: requests get past validation often
    enough to reach the model, and still probe every field's wrong types."""
    return st.one_of(*[good] * 7, json_values)


# model names: real, absent, malformed; never anything that would reach a network source
names = mostly(st.sampled_from(["tiny", "tiny:latest", "library/tiny", "nope", "", " ", "../x", "a:b:c", "TINY",
                                "x" * 300])
               | st.text(max_size=20).filter(lambda s: "hf" not in s.lower() and not s.strip().startswith(("/", ".", "~"))))
option_values = {
    "temperature": st.floats(-1, 3), "top_k": st.integers(-2, 100), "top_p": st.floats(-0.5, 1.5),
    "min_p": st.floats(-0.5, 1.5), "seed": st.integers(-(2**64), 2**65), "stop": st.lists(st.text(max_size=3), max_size=2),
    "repeat_penalty": st.floats(-1, 3), "repeat_last_n": st.integers(-3, 100), "num_ctx": st.integers(-1, 5000),
    "num_thread": st.integers(-1, 4), "mirostat": st.integers(0, 2), "presence_penalty": st.floats(-3, 3),
    "frequency_penalty": st.floats(-3, 3), "unknown_option": st.integers(),
}
options = mostly(st.fixed_dictionaries({}, optional={k: mostly(v) for k, v in option_values.items()}))
message = st.fixed_dictionaries(
    {"role": mostly(st.sampled_from(["user", "assistant", "system", "tool", "robot"]))},
    optional={"content": mostly(st.text(max_size=40)), "thinking": mostly(st.text(max_size=10)),
              "tool_calls": mostly(st.just([{"function": {"name": "f", "arguments": {"a": 1}}}])),
              "tool_name": mostly(st.text(max_size=5)), "images": mostly(st.just([]))})
messages = mostly(st.lists(message, max_size=3))
tools = mostly(st.just([{"type": "function", "function": {"name": "f", "description": "d",
                                                          "parameters": {"type": "object", "properties": {}}}}]))
generation_keys = {"options": options, "stream": mostly(st.booleans()),
                   "keep_alive": mostly(st.sampled_from([0, -1, 30, "5m", "1h", "-1", "10ms", "bogus", 1e300])),
                   "think": mostly(st.booleans() | st.sampled_from(["high", "low", "nope"])),
                   "format": mostly(st.sampled_from(["", "", "", "json"]))}
chat_bodies = st.fixed_dictionaries({"model": names}, optional={"messages": messages, "tools": tools, **generation_keys})
generate_bodies = st.fixed_dictionaries({"model": names}, optional={
    "prompt": mostly(st.text(max_size=40)), "system": mostly(st.text(max_size=10)), "raw": mostly(st.booleans()),
    "suffix": mostly(st.just("")), "context": mostly(st.just([])), **generation_keys})
model_bodies = st.fixed_dictionaries({}, optional={"model": names, "name": names, "verbose": mostly(st.booleans()),
                                                   "stream": mostly(st.booleans())})
copy_bodies = st.fixed_dictionaries({}, optional={"source": names, "destination": names})
# the same fields with well-typed values only (numbers still out of range at times): these reach the model
well_typed_options = st.fixed_dictionaries({}, optional=option_values)
well_typed = {"options": well_typed_options, "stream": st.booleans(),
              "keep_alive": st.sampled_from([0, -1, 30, "5m", "1h", "-1", "10ms", "bogus", 1e300]),
              "think": st.booleans() | st.sampled_from(["high", "low", "nope"])}
well_typed_chat = st.fixed_dictionaries({"model": st.sampled_from(["tiny", "tiny:latest", "nope"]), "messages": st.lists(
    st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant", "system", "tool"]), "content": st.text(max_size=40)},
                          optional={"thinking": st.text(max_size=10), "tool_name": st.text(max_size=5)}),
    min_size=1, max_size=4)}, optional={"tools": tools, **well_typed})
well_typed_generate = st.fixed_dictionaries({"model": st.sampled_from(["tiny", "tiny:latest", "nope"]),
                                             "prompt": st.text(max_size=60)},
                                            optional={"system": st.text(max_size=10), "raw": st.booleans(), **well_typed})
raw_bodies = st.binary(max_size=40) | st.text(max_size=40).map(str.encode) | json_values.map(lambda v: json.dumps(v).encode())


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    store: Store = pulled_home(tmp_path_factory.mktemp("ft_home"))
    with LiveServer(store, max_queue=4) as live:
        yield live


def bounded(body: Any) -> Any:
    """Cap any generation the body could start at 2 tokens (the fuzz is about shapes, not length)."""
    if isinstance(body, dict) and (body.get("options") is None or isinstance(body.get("options"), dict)):
        body = {**body, "options": {**(body.get("options") or {}), "num_predict": 2}}
        body["options"].pop("max_tokens", None)
    return body


def check(server: LiveServer, method: str, path: str, body: Any = None, content: bytes | None = None) -> None:
    with httpx.Client(timeout=60) as client:
        kwargs: dict[str, Any] = {"content": content} if content is not None else {"json": body}
        with client.stream(method, server.url + path, **kwargs) as r:
            raw = r.read()
    assert r.status_code < 500 or r.status_code in (501, 503, 507), (r.status_code, raw[:300])
    lines = [json.loads(line) for line in raw.splitlines() if line.strip()]
    assert lines, "an empty answer"
    if r.status_code >= 400:
        assert isinstance(lines[0].get("error"), str) and lines[0]["error"], lines[0]
    for item in lines:
        assert "error" not in item or "generation failed" not in item["error"], item


@SETTINGS
@given(body=chat_bodies | well_typed_chat)
def test_fuzz_chat(server: LiveServer, body: Any) -> None:
    check(server, "POST", "/api/chat", bounded(body))


@SETTINGS
@given(body=generate_bodies | well_typed_generate)
def test_fuzz_generate(server: LiveServer, body: Any) -> None:
    check(server, "POST", "/api/generate", bounded(body))


@settings(SETTINGS, max_examples=EXAMPLES // 2)
@given(path=st.sampled_from(["/api/show", "/api/pull", "/api/delete", "/api/copy", "/api/chat"]),
       body=model_bodies | copy_bodies)
def test_fuzz_model_endpoints(server: LiveServer, path: str, body: Any) -> None:
    if path == "/api/delete" and isinstance(body, dict):
        body = {k: v for k, v in body.items() if not (isinstance(v, str) and "tiny" in v.lower())}
    check(server, "DELETE" if path == "/api/delete" else "POST", path, bounded(body) if path == "/api/chat" else body)


@settings(SETTINGS, max_examples=EXAMPLES // 2)
@given(path=st.sampled_from(["/api/chat", "/api/generate", "/api/show", "/api/copy", "/api/pull"]), content=raw_bodies)
def test_fuzz_raw_bytes(server: LiveServer, path: str, content: bytes) -> None:
    try:
        bounded_body = bounded(json.loads(content))
        content = json.dumps(bounded_body).encode()
    except ValueError:
        pass
    check(server, "POST", path, content=content)


def test_server_survives_the_fuzz(server: LiveServer) -> None:
    r = httpx.post(server.url + "/api/chat", json={"model": "tiny", "stream": False, "options": {"num_predict": 3},
                                                   "messages": [{"role": "user", "content": "still fine?"}]}, timeout=60)
    assert r.status_code == 200 and r.json()["done"]
    assert httpx.get(server.url + "/api/tags").status_code == 200
    assert server.wait_for(lambda: server.manager.admission.waiting == 0)
