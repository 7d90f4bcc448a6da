"""`ft serve`'s Ollama API through the real `ollama` client, on the built-in tiny model (CPU, loopback)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import ollama
import pytest

from registry import Store
from runtime.loading.registered import open_model
from runtime.text.tokenizer import Tokenizer
from tests.test_server_util import LiveServer, free_port

FEW = {"num_predict": 6}


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LiveServer, list[Any]]]:
    """A server over an empty store; tiny arrives through /api/pull (its progress kept for a test)."""
    store = Store(tmp_path_factory.mktemp("ft_home"))
    with LiveServer(store) as server:
        progress = list(ollama.Client(host=server.url).pull("tiny", stream=True))
        yield server, progress


@pytest.fixture
def server(live: tuple[LiveServer, list[Any]]) -> LiveServer:
    return live[0]


@pytest.fixture
def client(server: LiveServer) -> ollama.Client:
    return ollama.Client(host=server.url, timeout=60)


def post(server: LiveServer, path: str, **kwargs: Any) -> httpx.Response:
    return httpx.post(server.url + path, timeout=60, **kwargs)


def test_pull_streams_progress(live: tuple[LiveServer, list[Any]], client: ollama.Client) -> None:
    _, events = live
    statuses = [e.status for e in events]
    assert statuses[0] == "building the tiny model locally" and statuses[-1] == "success"
    converting = [e for e in events if e.total]
    assert converting and converting[-1].completed > 0.9 * converting[-1].total  # byte progress, near the end
    assert all(0 <= (e.completed or 0) <= e.total for e in converting)
    done = [e.completed for e in converting]
    assert done == sorted(done) and len(done) > 10
    again = [e.status for e in client.pull("tiny", stream=True)]
    assert again == ["tiny:latest is up to date", "success"]
    assert client.pull("tiny").status == "success"  # stream=False: one object


def test_pull_unknown_model_is_404(client: ollama.Client) -> None:
    with pytest.raises(ollama.ResponseError) as e:
        client.pull("no-such-model-here")
    assert e.value.status_code == 404 and "no-such-model-here" in e.value.error


def test_a_pull_from_an_unreachable_hub_says_its_step_and_fails_at_once(client: ollama.Client,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Offline, a client of the server saw nothing for 18-20 s of retried lookups: the stream
    names its step, then the error names the host, at once."""
    import time

    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{free_port()}")  # (nothing listens there)
    monkeypatch.setenv("FT_PULL_RETRIES", "5")
    monkeypatch.setenv("FT_PULL_RETRY_DELAY_S", "2")
    said: list[str] = []
    start = time.perf_counter()
    with pytest.raises(ollama.ResponseError) as e:
        for event in client.pull("hf://Qwen/Qwen3-30B-A3B", stream=True):
            said.append(event.status)
    assert time.perf_counter() - start < 3.0
    assert said == ["pulling manifest of Qwen/Qwen3-30B-A3B"]
    assert "127.0.0.1 refused the connection" in e.value.error and "ft pull ./model.gguf" in e.value.error


def test_version_root_and_openapi(server: LiveServer) -> None:
    assert httpx.get(server.url + "/").text == "Ollama is running"
    assert httpx.head(server.url + "/").status_code == 200
    assert httpx.get(server.url + "/api/version").json()["version"]
    paths = httpx.get(server.url + "/openapi.json").json()["paths"]
    assert {"/api/chat", "/api/generate", "/api/tags", "/api/pull", "/api/ps"} <= set(paths)


def test_chat_non_streaming(client: ollama.Client) -> None:
    r = client.chat(model="tiny", messages=[{"role": "user", "content": "Hello"}], options=FEW)
    assert r.done and r.done_reason in ("stop", "length") and r.message.role == "assistant"
    assert 0 < r.eval_count <= 6 and r.prompt_eval_count > 5
    assert r.total_duration >= r.eval_duration > 0 and r.prompt_eval_duration > 0
    assert r.model == "tiny" and r.created_at


def test_chat_streaming_matches_non_streaming(client: ollama.Client) -> None:
    messages = [{"role": "user", "content": "Why is the sky blue?"}]
    options = {"num_predict": 12, "seed": 7, "temperature": 0}
    whole = client.chat(model="tiny", messages=messages, options=options)
    chunks = list(client.chat(model="tiny", messages=messages, options=options, stream=True))
    assert all(not c.done for c in chunks[:-1]) and chunks[-1].done
    assert "".join(c.message.content or "" for c in chunks) == whole.message.content
    assert chunks[-1].eval_count == whole.eval_count == 12 and chunks[-1].done_reason == "length"


def test_multi_turn_reuses_the_prefix(server: LiveServer, client: ollama.Client) -> None:
    history = [{"role": "user", "content": "Tell me about rivers."}]
    first = client.chat(model="tiny", messages=history, options=FEW)
    runner = server.manager.runners["ft.local/library/tiny:latest"]
    history += [{"role": "assistant", "content": first.message.content}, {"role": "user", "content": "And lakes?"}]
    second = client.chat(model="tiny", messages=history, options=FEW)
    assert second.prompt_eval_count > first.prompt_eval_count
    assert len(runner.session.tokens) >= second.prompt_eval_count  # one session kept the conversation


def test_generate(server: LiveServer, client: ollama.Client) -> None:
    r = client.generate(model="tiny", prompt="Once upon a time", options={"num_predict": 5, "temperature": 0})
    assert r.done and r.response is not None and r.eval_count == 5
    chunks = list(client.generate(model="tiny", prompt="Once upon a time", options={"num_predict": 5, "temperature": 0},
                                  stream=True))
    assert "".join(c.response for c in chunks) == r.response and chunks[-1].done_reason == "length"
    prompt = "<|im_start|>user\nhi<|im_end|>\n"
    raw = client.generate(model="tiny", prompt=prompt, raw=True, options=FEW)
    tokenizer = Tokenizer.from_model(open_model(server.store, "tiny"))
    assert raw.done and raw.prompt_eval_count == len(tokenizer.encode(prompt, True))  # no template around it
    system = client.generate(model="tiny", prompt="hi", system="You are terse.", options=FEW)
    assert system.prompt_eval_count > raw.prompt_eval_count


def test_stop_sequences_and_think(client: ollama.Client) -> None:
    base = client.chat(model="tiny", messages=[{"role": "user", "content": "hi"}],
                       options={"num_predict": 20, "temperature": 0})
    text = base.message.content
    assert len(text) > 4
    stop = text[2:4]
    r = client.chat(model="tiny", messages=[{"role": "user", "content": "hi"}],
                    options={"num_predict": 20, "temperature": 0, "stop": [stop]})
    assert r.done_reason == "stop" and stop not in r.message.content and text.startswith(r.message.content)
    thought = client.chat(model="tiny", messages=[{"role": "user", "content": "hi"}], think=False, options=FEW)
    assert thought.prompt_eval_count > base.prompt_eval_count  # the template pre-fills an empty think block


def test_tool_conversation_renders(client: ollama.Client) -> None:
    tool = {"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
                                             "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                            "required": ["city"]}}}
    messages = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "get_weather",
                                                                          "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "content": "18C, sunny", "tool_name": "get_weather"},
    ]
    r = client.chat(model="tiny", messages=messages, tools=[tool], options=FEW)
    plain = client.chat(model="tiny", messages=messages[:1], options=FEW)
    assert r.done and r.prompt_eval_count > plain.prompt_eval_count + 20  # tools and the call are in the prompt


def test_list_show_copy_delete(client: ollama.Client) -> None:
    names = [m.model for m in client.list().models]
    assert "tiny:latest" in names
    tiny = next(m for m in client.list().models if m.model == "tiny:latest")
    assert tiny.size > 0 and len(tiny.digest) == 64 and tiny.details.family == "qwen3_moe"
    assert tiny.details.parameter_size == "2.1M" and tiny.details.quantization_level == "F32"
    shown = client.show("tiny")
    assert "FROM builtin://tiny" in shown.modelfile and "<|im_start|>" in shown.template
    assert "temperature" in shown.parameters and shown.modelinfo["qwen3_moe.context_length"] == 2048
    assert shown.capabilities == ["completion", "tools", "thinking"]
    assert shown.license == "apache-2.0"  # the recipe's, as `ft show --license` prints it (it was empty)
    assert client.copy("tiny", "tiny-copy:v1").status == "success"
    assert "tiny-copy:v1" in [m.model for m in client.list().models]
    assert client.show("tiny-copy:v1").modelfile == shown.modelfile
    assert client.delete("tiny-copy:v1").status == "success"
    assert "tiny-copy:v1" not in [m.model for m in client.list().models]
    for call in (lambda: client.delete("tiny-copy:v1"), lambda: client.show("nope"), lambda: client.copy("nope", "x")):
        with pytest.raises(ollama.ResponseError) as e:
            call()
        assert e.value.status_code == 404


def test_create_from_a_stored_model(server: LiveServer, client: ollama.Client) -> None:
    """/api/create as the `ollama` client sends it: FROM a stored model with its own system
    prompt, parameters, messages and license, stored as `ft create` stores a Modelfile's (the
    weights' blobs shared); and a Modelfile, as older clients send one."""
    done = client.create(model="terse", from_="tiny", system="Be terse.", parameters={"temperature": 0.25,
                         "stop": ["<end>", "###"]}, messages=[{"role": "user", "content": "hi"},
                                                             {"role": "assistant", "content": "hello"}],
                         license="MIT")
    assert done.status == "success"
    shown = client.show("terse")
    assert shown.license == "MIT" and post(server, "/api/show", json={"model": "terse"}).json()["system"] == "Be terse."
    assert "temperature" in shown.parameters and "0.25" in shown.parameters and '"###"' in shown.parameters
    assert 'MESSAGE user "hi"\nMESSAGE assistant "hello"' in shown.modelfile
    assert [m.model for m in client.list().models if m.model == "terse:latest"]
    answer = client.chat(model="terse", messages=[{"role": "user", "content": "again"}], options=FEW)
    assert answer.done and answer.prompt_eval_count > 0
    streamed = list(client.create(model="twin", from_="terse", stream=True))
    assert [p.status for p in streamed][-1] == "success"
    legacy = post(server, "/api/create", json={"model": "legacy", "modelfile": 'FROM tiny\nSYSTEM "old style"\n',
                                               "stream": False})
    assert legacy.status_code == 200 and post(server, "/api/show", json={"model": "legacy"}).json()["system"] == "old style"
    for name in ("terse", "twin", "legacy"):
        assert client.delete(name).status == "success"
    with pytest.raises(ollama.ResponseError) as e:
        client.create(model="x", from_="no-such-model")
    assert e.value.status_code == 404


def test_ps_and_keep_alive(server: LiveServer, client: ollama.Client) -> None:
    client.chat(model="tiny", messages=[{"role": "user", "content": "hi"}], options=FEW, keep_alive="2m")
    [loaded] = client.ps().models
    assert loaded.model == "tiny:latest" and loaded.size_vram == 0 and loaded.context_length == 2048
    assert loaded.size > 8_000_000 and 100 < loaded.expires_at.timestamp() - __import__("time").time() <= 120
    raw = httpx.get(server.url + "/api/ps").json()["models"][0]["ft"]
    assert raw["processor"] == "100% CPU" and raw["expert_cache_bytes"] == 0 and raw["vram_bytes"] == 0
    assert raw["kv_bytes"] > 0 and raw["ram_bytes"] == loaded.size
    # keep_alive 0 unloads right after the answer
    client.chat(model="tiny", messages=[{"role": "user", "content": "hi"}], options=FEW, keep_alive=0)
    assert server.wait_for(lambda: not client.ps().models)
    # an empty conversation loads; with keep_alive 0 it unloads (Ollama's load/unload requests)
    r = post(server, "/api/chat", json={"model": "tiny", "messages": []}).json()
    assert r["done_reason"] == "load" and r["done"] and [m.model for m in client.ps().models] == ["tiny:latest"]
    r = post(server, "/api/generate", json={"model": "tiny", "keep_alive": 0}).json()
    assert r["done_reason"] == "unload" and server.wait_for(lambda: not client.ps().models)
    # a short keep-alive expires on its own
    client.generate(model="tiny", prompt="hi", options=FEW, keep_alive="300ms")
    assert server.wait_for(lambda: not client.ps().models, timeout_s=3)
    client.generate(model="tiny", prompt="hi", options=FEW, keep_alive=-1)
    assert httpx.get(server.url + "/api/ps").json()["models"][0]["expires_at"].startswith("9999")


def test_a_model_unloaded_before_its_keep_alive_ends_leaves_no_timer(server: LiveServer, client: ollama.Client) -> None:
    """Unloaded early (keep_alive 0, ft stop, room for another model): its keep-alive timer goes
    too (it fired on the released model, an error in the server's log, and held it until then)."""
    client.generate(model="tiny", prompt="hi", options=FEW, keep_alive="1m")
    (runner,) = server.manager.runners.values()
    assert server.wait_for(lambda: runner.expiry is not None)  # (set once the request is done, after its reply)
    assert post(server, "/api/generate", json={"model": "tiny", "keep_alive": 0}).json()["done_reason"] == "unload"
    assert server.wait_for(lambda: not client.ps().models)
    assert runner.expiry is None and runner.expires_at is None


def test_curl_style_bodies_are_json(server: LiveServer) -> None:
    """`curl -d '{...}'` sends a form content type; Ollama reads JSON anyway."""
    r = post(server, "/api/generate", content=json.dumps({"model": "tiny", "prompt": "hi", "stream": False,
                                                          "options": FEW}),
             headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert r.status_code == 200 and r.json()["done"]
    lines = post(server, "/api/chat", content=json.dumps({"model": "tiny", "messages": [{"role": "user", "content": "x"}],
                                                          "options": FEW})).text.splitlines()
    assert json.loads(lines[-1])["done"] and all(not json.loads(x)["done"] for x in lines[:-1])


BAD_REQUESTS = [
    ("/api/chat", b"{not json", 400, "malformed JSON"),
    ("/api/chat", b"", 400, "JSON object"),
    ("/api/chat", b"[]", 400, "JSON object"),
    ("/api/chat", {"messages": [{"role": "user", "content": "hi"}]}, 400, "model"),
    ("/api/chat", {"model": "nope", "messages": [{"role": "user", "content": "hi"}]}, 404, "not found"),
    ("/api/chat", {"model": 5, "messages": []}, 400, "model"),
    ("/api/chat", {"model": "tiny", "messages": "hi"}, 400, "messages"),
    ("/api/chat", {"model": "tiny", "messages": [{"role": "user", "content": 5}]}, 400, "messages.0.content"),
    ("/api/chat", {"model": "tiny", "messages": [{"role": "wizard", "content": "x"}]}, 400, "role"),
    ("/api/chat", {"model": "tiny", "messages": [{"role": "user", "content": "x"}], "options": []}, 400, "options"),
    ("/api/chat", {"model": "tiny", "messages": [{"role": "user", "content": "x"}],
                   "options": {"temperature": "hot"}}, 400, "temperature"),
    ("/api/chat", {"model": "tiny", "messages": [{"role": "user", "content": "x"}],
                   "options": {"num_predict": -5}}, 400, "num_predict"),
    ("/api/chat", {"model": "tiny", "messages": [{"role": "user", "content": "x"}],
                   "options": {"no_such_option": 1}}, 400, "no_such_option"),
    ("/api/chat", {"model": "tiny", "messages": [{"role": "user", "content": "x"}], "keep_alive": "forever"},
     400, "keep_alive"),
    ("/api/chat", {"model": "tiny", "messages": [{"role": "user", "content": "x"}], "stream": "maybe"}, 400, "stream"),
    ("/api/chat", {"model": "tiny", "messages": [{"role": "user", "content": "x"}], "think": "extreme"}, 400, "think"),
    ("/api/chat", {"model": "tiny", "messages": [{"role": "user", "content": "x"}], "format": "json"}, 400, "format"),
    ("/api/chat", {"model": "tiny", "messages": [{"role": "user", "content": "x", "images": ["aGk="]}]},
     400, "images"),
    ("/api/chat", {"model": "tiny", "messages": [{"role": "user", "content": "word " * 200}],
                   "options": {"num_ctx": 64}}, 400, "the context is 64; shorten it or raise num_ctx"),
    ("/api/chat", {"model": "tiny", "messages": [{"role": "user", "content": "word " * 3000}],  # past tiny's 2048
                   "options": {"num_ctx": 20000}}, 400, "the context is 2048, this model's most; shorten it"),
    ("/api/chat", {"model": "../../etc/passwd", "messages": []}, 400, "name"),
    ("/api/generate", {"model": "tiny", "prompt": 7}, 400, "prompt"),
    ("/api/generate", {"model": "tiny", "prompt": "x", "suffix": "y"}, 400, "suffix"),
    ("/api/generate", {"model": "tiny", "prompt": "x", "context": [1, 2]}, 400, "context"),
    ("/api/show", {}, 400, "model is required"),
    ("/api/copy", {"source": "tiny"}, 400, "destination"),
    ("/api/copy", {"source": "tiny", "destination": "a/b/c/d/e"}, 400, "name"),
    ("/api/pull", {"model": ""}, 400, "model is required"),
    ("/api/embed", {"model": "tiny", "input": "x"}, 501, "not supported"),
    ("/api/create", {"model": "x"}, 400, "from is required"),
    ("/api/create", {"model": "x", "from": "tiny", "files": {"a.gguf": "sha256:00"}}, 400, "uploaded files"),
    ("/api/create", {"model": "x", "from": "tiny", "quantize": "q4_K_M"}, 400, "does not re-quantize"),
    ("/api/create", {"model": "x", "from": "tiny", "parameters": {"temperature": -1}}, 400, "temperature"),
    ("/api/create", {"model": "a/b/c/d/e", "from": "tiny"}, 400, "name"),
    ("/api/create", {"model": "x", "from": "/etc"}, 400, "makes a model FROM a stored one"),
    ("/api/create", {"model": "x", "modelfile": "FROM hf://org/repo\nFAMILY qwen3_moe\n"}, 400,
     "pull it first (/api/pull)"),
    ("/api/nothing", {}, 404, "no such endpoint"),
]


@pytest.mark.parametrize("path, body, status, words", BAD_REQUESTS)
def test_bad_requests_get_4xx_with_a_reason(server: LiveServer, path: str, body: Any, status: int, words: str) -> None:
    if isinstance(body, bytes):
        r = post(server, path, content=body, headers={"Content-Type": "application/json"})
    else:
        r = post(server, path, json=body)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert isinstance(error, str) and words.lower() in error.lower(), error


def test_wrong_method_and_server_still_answers(server: LiveServer, client: ollama.Client) -> None:
    r = httpx.put(server.url + "/api/chat", json={})
    assert r.status_code == 405 and "error" in r.json()
    assert client.chat(model="tiny", messages=[{"role": "user", "content": "still there?"}], options=FEW).done
    assert server.manager.admission.waiting == 0


def test_api_key(tmp_path_factory: pytest.TempPathFactory, live: tuple[LiveServer, list[Any]]) -> None:
    store = live[0].store
    with LiveServer(store, api_key="s3cret") as keyed:
        assert httpx.get(keyed.url + "/").status_code == 200  # "is it running?" stays open
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"x-api-key": "nope"}, {"Authorization": "s3cret"}):
            r = httpx.get(keyed.url + "/api/tags", headers=headers)
            assert r.status_code == 401 and "API key" in r.json()["error"]
        assert httpx.get(keyed.url + "/api/tags", headers={"Authorization": "Bearer s3cret"}).status_code == 200
        assert httpx.get(keyed.url + "/api/tags", headers={"x-api-key": "s3cret"}).status_code == 200
        r = httpx.post(keyed.url + "/v1/chat/completions", json={})
        assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"  # OpenAI's shape
        authed = ollama.Client(host=keyed.url, headers={"Authorization": "Bearer s3cret"})
        assert authed.chat(model="tiny", messages=[{"role": "user", "content": "hi"}], options=FEW).done
        with pytest.raises(ollama.ResponseError) as e:
            ollama.Client(host=keyed.url).list()
        assert e.value.status_code == 401
    assert free_port()


def test_a_small_num_ctx_holds_for_its_own_request_only(server: LiveServer, client: ollama.Client) -> None:
    """One client's small num_ctx (Continue sends one with every request) must not shrink the
    context of the requests after it that name none, whichever API they come through."""
    long = [{"role": "user", "content": "word " * 200}]
    client.chat(model="tiny", messages=[{"role": "user", "content": "hi"}], options={**FEW, "num_ctx": 64})
    with pytest.raises(ollama.ResponseError, match="context"):
        client.chat(model="tiny", messages=long, options={**FEW, "num_ctx": 64})
    assert client.chat(model="tiny", messages=long, options=FEW).message is not None
    reply = post(server, "/v1/chat/completions", json={"model": "tiny", "messages": long, "max_tokens": 4})
    assert reply.status_code == 200, reply.text


def test_browsers_and_probes_get_what_ollama_gives_them(server: LiveServer, client: ollama.Client) -> None:
    """CORS for pages on this machine and editor webviews (preflight included, before any API
    key), HEAD on the probe endpoints, a clear 501 for OpenAI's embeddings, and num_thread over
    the CPU count cut to it rather than refused."""
    preflight = httpx.options(server.url + "/api/chat", headers={
        "Origin": "http://localhost:5173", "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "content-type"})
    assert preflight.status_code == 200 and preflight.headers["access-control-allow-origin"] == "http://localhost:5173"
    for origin, allowed in (("vscode-webview://abc", True), ("https://evil.example", False)):
        r = httpx.get(server.url + "/api/version", headers={"Origin": origin})
        assert ("access-control-allow-origin" in r.headers) == allowed
    assert httpx.head(server.url + "/api/tags").status_code == 200
    assert httpx.head(server.url + "/api/version").status_code == 200
    r = post(server, "/v1/embeddings", json={"model": "tiny", "input": "x"})
    assert r.status_code == 501 and "embeddings" in r.json()["error"]["message"]
    assert client.chat(model="tiny", messages=[{"role": "user", "content": "hi"}],
                       options={**FEW, "num_thread": 4096}).done
