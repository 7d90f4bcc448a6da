"""The OpenAI flavour driven by the real `openai` client against a scripted fake backend served
by uvicorn on 127.0.0.1: text, reasoning and tool calls, streamed and not, a tool-call round
trip, finish reasons, usage, and error mapping."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import httpx
import pytest

from runtime.server.protocol import (
    Busy,
    ChatRequest,
    Done,
    Event,
    GenerateRequest,
    ModelInfo,
    ModelNotFound,
    ReasoningDelta,
    ServerError,
    Started,
    TextDelta,
    ToolCallEvent,
)

openai = pytest.importorskip("openai")
fastapi = pytest.importorskip("fastapi")
uvicorn = pytest.importorskip("uvicorn")

MODEL = "tiny:latest"
WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather at a place",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


class FakeBackend:
    """A Backend that plays `script` (events, or an exception to raise at that point) and records
    every request it gets. Model "busy" raises Busy; names it does not list raise ModelNotFound."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.script: list[Event | Exception] = [TextDelta("Hello"), TextDelta(" world"),
                                                Done("stop", prompt_tokens=11, completion_tokens=2)]
        self.requests: list[ChatRequest | GenerateRequest] = []
        self.models = [ModelInfo("tiny:latest", "sha256:" + "a" * 64, 1000, 1_700_000_000.0, "qwen3_moe", "f32",
                                 1_000_000, 2048),
                       ModelInfo("qwen3:30b-a3b", "sha256:" + "b" * 64, 2000, 1_700_000_100.0, "qwen3_moe", "bf16",
                                 30_000_000_000, 40960)]

    def _check(self, model: str) -> None:
        if model == "busy":
            raise Busy("the server is busy: 4 requests queued; retry later")
        if model not in {m.name for m in self.models} | {m.name.removesuffix(":latest") for m in self.models}:
            raise ModelNotFound(f"model {model!r} not found")

    async def _play(self, request: ChatRequest | GenerateRequest) -> AsyncIterator[Event]:
        self.requests.append(request)
        self._check(request.model)
        done = next((item for item in self.script if isinstance(item, Done)), None)
        if done is not None and not isinstance(self.script[0], Exception):  # as the backend: once the prompt fits
            yield Started(prompt_tokens=done.prompt_tokens)
        for item in self.script:
            await asyncio.sleep(0)
            if isinstance(item, Exception):
                raise item
            yield item

    def chat(self, request: ChatRequest) -> AsyncIterator[Event]:
        return self._play(request)

    def generate(self, request: GenerateRequest) -> AsyncIterator[Event]:
        return self._play(request)

    def count_tokens(self, request: ChatRequest) -> int:
        self.requests.append(request)
        self._check(request.model)
        return 7 * len(request.messages)

    def list_models(self) -> list[ModelInfo]:
        return self.models


@pytest.fixture(scope="session")
def served():
    """(base URL, FakeBackend): both flavours' routers in one app on an ephemeral port."""
    from fastapi import FastAPI

    from runtime.server import anthropic_api, openai_api
    from tests.test_server_util import serving

    backend = FakeBackend()
    app = FastAPI()
    app.include_router(openai_api.make_router(backend))
    app.include_router(anthropic_api.make_router(backend))
    with serving(app) as url:
        yield url, backend


@pytest.fixture
def backend(served):
    served[1].reset()
    return served[1]


@pytest.fixture
def base_url(served):
    return served[0]


@pytest.fixture
def client(base_url, backend):
    with openai.OpenAI(base_url=base_url + "/v1", api_key="sk-test", max_retries=0) as c:
        yield c


def test_chat_non_streaming(client, backend):
    backend.script = [ReasoningDelta("Greet them."), TextDelta("Hello"), TextDelta(" world"),
                      Done("stop", prompt_tokens=11, completion_tokens=5)]
    reply = client.chat.completions.create(
        model=MODEL, messages=[{"role": "developer", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
        temperature=0.2, top_p=0.9, seed=7, max_completion_tokens=50, stop=["\n\n"], presence_penalty=0.5)
    assert reply.object == "chat.completion" and reply.model == MODEL and reply.id.startswith("chatcmpl-")
    choice = reply.choices[0]
    assert choice.message.content == "Hello world" and choice.message.role == "assistant"
    assert choice.message.reasoning_content == "Greet them."
    assert choice.finish_reason == "stop" and choice.message.tool_calls is None
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens, reply.usage.total_tokens) == (11, 5, 16)
    (request,) = backend.requests
    assert request == ChatRequest(
        model=MODEL, messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
        options={"max_completion_tokens": 50, "temperature": 0.2, "top_p": 0.9, "seed": 7, "stop": ["\n\n"],
                 "presence_penalty": 0.5}, stream=False)


def test_chat_streaming_with_usage(client, backend):
    backend.script = [ReasoningDelta("Hmm"), TextDelta("Hel"), TextDelta("lo"), Done("length", prompt_tokens=3,
                                                                                       completion_tokens=4)]
    chunks = list(client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}],
                                                 max_tokens=4, stream=True, stream_options={"include_usage": True}))
    assert all(c.object == "chat.completion.chunk" and c.id == chunks[0].id for c in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert "".join(d.content or "" for d in deltas) == "Hello"
    assert "".join(getattr(d, "reasoning_content", None) or "" for d in deltas) == "Hmm"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.total_tokens == 7
    assert all(c.usage is None for c in chunks[:-1])
    assert backend.requests[0].stream is True and backend.requests[0].options == {"max_tokens": 4}


def test_raw_stream_ends_with_done(base_url, backend):
    with httpx.stream("POST", base_url + "/v1/chat/completions",
                      json={"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "stream": True}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in r.iter_lines() if line]
    assert all(line.startswith("data: ") for line in lines) and lines[-1] == "data: [DONE]"
    payloads = [json.loads(line[6:]) for line in lines[:-1]]
    assert "usage" not in payloads[0] and payloads[-1]["choices"][0]["finish_reason"] == "stop"


def test_tool_call_round_trip(client, backend):
    backend.script = [TextDelta("Checking."), ToolCallEvent("call_abc", "get_weather", {"city": "Paris"}),
                      Done("tool_calls", prompt_tokens=20, completion_tokens=9)]
    messages = [{"role": "system", "content": "You help."}, {"role": "user", "content": [
        {"type": "text", "text": "Weather in"}, {"type": "text", "text": "Paris?"}]}]
    reply = client.chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER_TOOL])
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content == "Checking."
    (call,) = choice.message.tool_calls
    assert (call.id, call.type, call.function.name) == ("call_abc", "function", "get_weather")
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    first = backend.requests[0]
    assert first.tools == [WEATHER_TOOL] and first.tool_choice is None
    assert first.messages[1] == {"role": "user", "content": "Weather in\nParis?"}

    backend.script = [TextDelta("It is sunny."), Done("stop", prompt_tokens=40, completion_tokens=4)]
    messages += [choice.message.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": call.id, "content": '{"sky": "sunny"}'}]
    reply = client.chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER_TOOL], tool_choice="auto")
    assert reply.choices[0].message.content == "It is sunny."
    second = backend.requests[1]
    assert second.tool_choice == "auto"
    assert second.messages[2:] == [
        {"role": "assistant", "content": "Checking.", "tool_calls": [
            {"id": "call_abc", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "tool_call_id": "call_abc", "content": '{"sky": "sunny"}', "name": "get_weather"},
    ]


def test_streamed_tool_calls_accumulate(client, backend):
    backend.script = [ReasoningDelta("Two calls."), ToolCallEvent("call_1", "get_weather", {"city": "Paris"}),
                      ToolCallEvent("call_2", "get_weather", {"city": "Rome"}), Done("stop", prompt_tokens=10, completion_tokens=8)]
    with client.chat.completions.stream(model=MODEL, messages=[{"role": "user", "content": "Paris and Rome"}],
                                        tools=[WEATHER_TOOL], tool_choice="required") as stream:
        final = stream.get_final_completion()
    calls = final.choices[0].message.tool_calls
    assert [(c.id, c.function.name, json.loads(c.function.arguments)) for c in calls] == [
        ("call_1", "get_weather", {"city": "Paris"}), ("call_2", "get_weather", {"city": "Rome"})]
    assert final.choices[0].finish_reason == "tool_calls"
    assert backend.requests[0].tool_choice == "required"


def test_tool_choice(client, backend):
    ask = [{"role": "user", "content": "Hi"}]
    client.chat.completions.create(model=MODEL, messages=ask, tools=[WEATHER_TOOL],
                                   tool_choice={"type": "function", "function": {"name": "get_weather"}})
    client.chat.completions.create(model=MODEL, messages=ask, tools=[WEATHER_TOOL], tool_choice="none")
    named, none = backend.requests
    assert named.tool_choice == {"type": "function", "function": {"name": "get_weather"}}
    assert none.tools is None and none.tool_choice is None
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=ask, tools=[WEATHER_TOOL],
                                       tool_choice={"type": "function", "function": {"name": "nope"}})
    assert e.value.body["param"] == "tool_choice"


def test_reasoning_switches(client, backend):
    ask = [{"role": "user", "content": "Hi"}]
    client.chat.completions.create(model=MODEL, messages=ask, reasoning_effort="high")
    client.chat.completions.create(model=MODEL, messages=ask, extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    client.chat.completions.create(model=MODEL, messages=ask)
    assert [r.think for r in backend.requests] == [True, False, None]


def test_assistant_reasoning_is_passed_back(client, backend):
    client.chat.completions.create(model=MODEL, messages=[
        {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello", "reasoning_content": "greet"},
        {"role": "user", "content": "Again"}])
    assert backend.requests[0].messages[1] == {"role": "assistant", "content": "Hello", "reasoning_content": "greet"}


def test_completions(client, backend):
    backend.script = [TextDelta(" there"), Done("length", prompt_tokens=2, completion_tokens=1)]
    reply = client.completions.create(model=MODEL, prompt="Hello", max_tokens=1, temperature=0, echo=True)
    assert reply.object == "text_completion" and reply.choices[0].text == "Hello there"
    assert reply.choices[0].finish_reason == "length" and reply.usage.total_tokens == 3
    assert backend.requests[0] == GenerateRequest(model=MODEL, prompt="Hello", raw=True,
                                                  options={"max_tokens": 1, "temperature": 0}, stream=False,
                                                  default_max_tokens=16)
    backend.script = [TextDelta("a"), TextDelta("b"), Done("stop", prompt_tokens=2, completion_tokens=2)]
    chunks = list(client.completions.create(model=MODEL, prompt="x", stream=True, stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == "ab"
    assert chunks[-1].usage.completion_tokens == 2
    assert backend.requests[1].stream is True
    assert backend.requests[1].options == {} and backend.requests[1].default_max_tokens == 16  # OpenAI's and vLLM's


def test_models(client):
    assert [m.id for m in client.models.list()] == ["tiny:latest", "qwen3:30b-a3b"]
    model = client.models.retrieve("tiny")
    assert (model.id, model.object, model.created) == ("tiny:latest", "model", 1_700_000_000)
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("nope")


def test_errors_map_to_typed_exceptions(client, backend):
    ask = [{"role": "user", "content": "Hi"}]
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(model="nope", messages=ask)
    assert e.value.status_code == 404 and e.value.code == "model_not_found" and "nope" in e.value.message
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="nope", messages=ask, stream=True)
    with pytest.raises(openai.InternalServerError) as e:
        client.chat.completions.create(model="busy", messages=ask)
    assert e.value.status_code == 503 and e.value.type == "server_error"
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": [
            {"type": "text", "text": "What is this?"}, {"type": "image_url", "image_url": {"url": "data:,"}}]}])
    assert e.value.body["param"] == "messages[0].content[1]" and e.value.type == "invalid_request_error"
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=ask, temperature=-1)
    assert e.value.body["param"] == "temperature"
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=MODEL, messages=[])
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=[
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{not json"}}]}])
    assert e.value.body["param"] == "messages[0].tool_calls[0].function.arguments"
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=MODEL, messages=ask, n=2)
    assert all(r.model in ("nope", "busy") for r in backend.requests)  # nothing invalid reached the backend


def test_error_mid_stream(client, backend):
    backend.script = [TextDelta("partial"), ServerError("generation failed: out of memory")]
    with pytest.raises(openai.APIError, match="out of memory"):
        for _ in client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}], stream=True):
            pass


def test_malformed_body(base_url, backend):
    r = httpx.post(base_url + "/v1/chat/completions", content=b"{nope", headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    r = httpx.post(base_url + "/v1/chat/completions", json=[1, 2])
    assert r.status_code == 400 and "JSON object" in r.json()["error"]["message"]


def test_messages_render_with_real_templates(client, backend):
    """What the flavour hands the backend renders with the vendored chat templates."""
    from pathlib import Path

    from runtime.text.chat_template import render_chat

    client.chat.completions.create(model=MODEL, tools=[WEATHER_TOOL], messages=[
        {"role": "system", "content": "You help."}, {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"}])
    request = backend.requests[0]
    for name in ("qwen3.jinja", "qwen3_5.jinja", "glm_4_5.jinja", "glm_5_3_flash.jinja"):
        template = (Path(__file__).parent / "data" / "chat_templates" / name).read_text()
        prompt = render_chat(template, request.messages, tools=request.tools)
        assert "sunny" in prompt and "Paris" in prompt and "get_weather" in prompt


# -- end to end: the real backend and the built-in tiny model (CPU, loopback) --


@pytest.fixture(scope="session")
def live_tiny(tmp_path_factory):
    """A live `ft serve` (create_app over the real ModelManager) holding the tiny model."""
    pytest.importorskip("runtime.server.backend")
    server_util = pytest.importorskip("tests.test_server_util")
    store = server_util.pulled_home(tmp_path_factory.mktemp("ft_home"))
    with server_util.LiveServer(store) as server:
        yield server.url


def test_tiny_end_to_end(live_tiny):
    client = openai.OpenAI(base_url=live_tiny + "/v1", api_key="unused", max_retries=0, timeout=120)
    ask = {"model": "tiny", "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 6, "temperature": 0}
    reply = client.chat.completions.create(**ask)
    assert reply.choices[0].finish_reason in ("stop", "length")
    assert reply.usage.prompt_tokens > 5 and 0 < reply.usage.completion_tokens <= 6
    chunks = list(client.chat.completions.create(**ask, stream=True, stream_options={"include_usage": True}))
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == (reply.choices[0].message.content or "")
    usage = chunks[-1].usage  # the same prompt again: all of it but its last token served from the cache
    assert (usage.prompt_tokens, usage.completion_tokens) == (reply.usage.prompt_tokens, reply.usage.completion_tokens)
    assert usage.prompt_tokens_details.cached_tokens == usage.prompt_tokens - 1
    # a tool round trip renders through the tiny model's template
    call = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    reply = client.chat.completions.create(**{**ask, "messages": [
        {"role": "user", "content": "Weather?"}, {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"}]}, tools=[WEATHER_TOOL])
    assert reply.usage.prompt_tokens > 100  # the tool list is in the prompt
    completion = client.completions.create(model="tiny", prompt="Once upon", max_tokens=4, temperature=0)
    assert 0 < completion.usage.prompt_tokens <= len("Once upon")  # raw: no template around it
    assert completion.choices[0].finish_reason in ("stop", "length")
    assert "tiny:latest" in [m.id for m in client.models.list()]
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(**{**ask, "model": "no-such-model"})


def test_a_final_assistant_message_starts_a_turn_unless_asked_to_continue(live_tiny):
    """OpenAI's API answers a final assistant message with a turn of its own; vLLM's
    continue_final_message (and Ollama's /api/chat always) continues it instead."""
    client = openai.OpenAI(base_url=live_tiny + "/v1", api_key="unused", max_retries=0, timeout=120)
    messages = [{"role": "user", "content": "Hello"}, {"role": "assistant", "content": "Sure"}]
    ask = {"model": "tiny", "messages": messages, "max_tokens": 2, "temperature": 0}
    as_turn = client.chat.completions.create(**ask).usage.prompt_tokens
    continued = client.chat.completions.create(**ask, extra_body={"continue_final_message": True}).usage.prompt_tokens
    assert continued < as_turn
    ollama_reply = httpx.post(live_tiny + "/api/chat", timeout=120, json={
        "model": "tiny", "messages": messages, "stream": False, "options": {"num_predict": 2, "temperature": 0}}).json()
    assert ollama_reply["prompt_eval_count"] == continued


def test_legacy_completions_default_to_16_tokens_unless_the_recipe_says(live_tiny, tmp_path, monkeypatch):
    """OpenAI's documented default for /v1/completions (it ran to the end of the context); a
    Modelfile's num_predict, where the model has one, goes first."""
    import asyncio

    from runtime.server import models
    from runtime.server.backend import ModelManager
    from runtime.server.protocol import GenerateRequest
    from tests.test_server_util import pulled_home

    client = openai.OpenAI(base_url=live_tiny + "/v1", api_key="unused", max_retries=0, timeout=120)
    assert client.completions.create(model="tiny", prompt="Once upon", temperature=0).usage.completion_tokens <= 16

    manager, asked = ModelManager(pulled_home(tmp_path)), []

    async def generation(registered, options, *args, **kwargs):  # what the model would be asked for
        asked.append(options.sampling.max_tokens)
        yield Done("stop")

    monkeypatch.setattr(manager, "_generate", generation)
    lookup = models.lookup
    for recipe, request in (({}, {}), ({"num_predict": 256}, {}), ({}, {"max_tokens": -1}), ({"num_predict": -2}, {})):
        def with_recipe(store, name, recipe=recipe):
            registered = lookup(store, name)
            registered.config["parameters"] = recipe
            return registered

        monkeypatch.setattr(models, "lookup", with_recipe)

        async def drain(request=request):
            return [e async for e in manager.generate(GenerateRequest("tiny", "x", raw=True, options=request,
                                                                      default_max_tokens=16))]

        asyncio.run(drain())
    assert asked == [16, 256, None, None]  # -1 and num_predict -2: no limit, asked for
