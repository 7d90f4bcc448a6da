"""The Anthropic flavour driven by the real `anthropic` client (its streaming helpers included)
against the scripted fake backend of test_server_openai: content blocks, thinking, tool use
round trips as a coding agent sends them, stop reasons, usage, the exact event sequence, errors."""

from __future__ import annotations

import json

import httpx
import pytest

from runtime.server.protocol import Done, ReasoningDelta, ServerError, TextDelta, ToolCallEvent
from tests.test_server_openai import FakeBackend, backend, base_url, live_tiny, served  # noqa: F401 (fixtures)

anthropic = pytest.importorskip("anthropic")

MODEL = "tiny:latest"
READ_TOOL = {"name": "read_file", "description": "Read a file",
             "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}
HEADERS = {"x-api-key": "sk-ant-test", "anthropic-version": "2023-06-01"}


@pytest.fixture
def client(base_url, backend):  # noqa: F811
    with anthropic.Anthropic(base_url=base_url, api_key="sk-ant-test", max_retries=0) as c:
        yield c


def test_message_non_streaming(client, backend):  # noqa: F811
    backend.script = [ReasoningDelta("Say hi."), TextDelta("Hello"), TextDelta("!"),
                      Done("stop", prompt_tokens=12, completion_tokens=3)]
    message = client.messages.create(
        model=MODEL, max_tokens=100, system=[{"type": "text", "text": "Be brief."}, {"type": "text", "text": "Be kind."}],
        messages=[{"role": "user", "content": "Hi"}], stop_sequences=["END"],
        thinking={"type": "enabled", "budget_tokens": 1024},
        extra_body={"temperature": 0.5, "top_p": 0.9, "top_k": 20})  # this SDK version dropped the sampling kwargs
    assert message.type == "message" and message.role == "assistant" and message.model == MODEL
    assert message.id.startswith("msg_")
    assert [b.type for b in message.content] == ["thinking", "text"]
    assert message.content[0].thinking == "Say hi." and message.content[1].text == "Hello!"
    assert message.stop_reason == "end_turn" and message.stop_sequence is None
    assert (message.usage.input_tokens, message.usage.output_tokens) == (12, 3)
    (request,) = backend.requests
    assert request.messages == [{"role": "system", "content": "Be brief.\nBe kind."}, {"role": "user", "content": "Hi"}]
    assert request.options == {"max_tokens": 100, "temperature": 0.5, "top_p": 0.9, "top_k": 20, "stop": ["END"]}
    assert request.think is True and request.stream is False and request.tools is None


def test_stream_helpers_accumulate_the_message(client, backend):  # noqa: F811
    backend.script = [ReasoningDelta("Need the file."), ReasoningDelta(" Read it."), TextDelta("Reading."),
                      ToolCallEvent("call_1", "read_file", {"path": "a.py"}),
                      ToolCallEvent("call_2", "read_file", {"path": "b.py"}),
                      Done("tool_calls", prompt_tokens=30, completion_tokens=17)]
    with client.messages.stream(model=MODEL, max_tokens=1000, tools=[READ_TOOL],
                                messages=[{"role": "user", "content": "Read a.py and b.py"}]) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == "Reading."
    assert [b.type for b in final.content] == ["thinking", "text", "tool_use", "tool_use"]
    assert final.content[0].thinking == "Need the file. Read it."
    assert [(b.id, b.name, b.input) for b in final.content[2:]] == [
        ("call_1", "read_file", {"path": "a.py"}), ("call_2", "read_file", {"path": "b.py"})]
    assert final.stop_reason == "tool_use"
    assert (final.usage.input_tokens, final.usage.output_tokens) == (30, 17)
    assert backend.requests[0].tools == [{"type": "function", "function": {
        "name": "read_file", "parameters": READ_TOOL["input_schema"], "description": "Read a file"}}]


def test_exact_event_sequence(base_url, backend):  # noqa: F811
    backend.script = [ReasoningDelta("r"), TextDelta("a"), TextDelta("b"), ToolCallEvent("call_9", "read_file", {"path": "x"}),
                      Done("tool_calls", prompt_tokens=4, completion_tokens=6)]
    body = {"model": MODEL, "max_tokens": 10, "stream": True, "tools": [READ_TOOL],
            "messages": [{"role": "user", "content": "go"}]}
    with httpx.stream("POST", base_url + "/v1/messages", json=body, headers=HEADERS) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        raw = r.read().decode()
    events = []
    for block in raw.strip().split("\n\n"):
        name_line, data_line = block.split("\n")
        name, data = name_line.removeprefix("event: "), json.loads(data_line.removeprefix("data: "))
        assert data["type"] == name
        events.append(data)
    assert [(e["type"], e.get("index"), (e.get("delta") or e.get("content_block") or {}).get("type")) for e in events] == [
        ("message_start", None, None),
        ("content_block_start", 0, "thinking"), ("ping", None, None), ("content_block_delta", 0, "thinking_delta"),
        ("content_block_stop", 0, None),
        ("content_block_start", 1, "text"), ("content_block_delta", 1, "text_delta"),
        ("content_block_delta", 1, "text_delta"), ("content_block_stop", 1, None),
        ("content_block_start", 2, "tool_use"), ("content_block_delta", 2, "input_json_delta"),
        ("content_block_stop", 2, None),
        ("message_delta", None, None), ("message_stop", None, None)]
    start = events[0]["message"]
    assert start["content"] == [] and start["stop_reason"] is None and start["role"] == "assistant"
    assert start["usage"]["input_tokens"] == 4  # known before any output, as the API reports it
    assert events[9]["content_block"] == {"type": "tool_use", "id": "call_9", "name": "read_file", "input": {}}
    assert json.loads(events[10]["delta"]["partial_json"]) == {"path": "x"}
    assert events[-2]["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}
    assert events[-2]["usage"]["output_tokens"] == 6 and events[-2]["usage"]["input_tokens"] == 4


def test_tool_use_round_trip(client, backend):  # noqa: F811
    backend.script = [ToolCallEvent("call_r1", "read_file", {"path": "a.py"}),
                      Done("tool_calls", prompt_tokens=9, completion_tokens=5)]
    messages = [{"role": "user", "content": [{"type": "text", "text": "<system-reminder>cwd: /src</system-reminder>"},
                                             {"type": "text", "text": "Show a.py", "cache_control": {"type": "ephemeral"}}]}]
    first = client.messages.create(model=MODEL, max_tokens=256, tools=[READ_TOOL], messages=messages,
                                   system="You are a coding agent.")
    assert first.stop_reason == "tool_use"
    (tool_use,) = first.content
    backend.script = [TextDelta("It prints hi."), Done("stop", prompt_tokens=40, completion_tokens=4)]
    messages += [
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "Read it.", "signature": ""},
                                          *[b.model_dump(exclude_none=True) for b in first.content]]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": tool_use.id, "content": [{"type": "text", "text": "print('hi')"}]},
            {"type": "text", "text": "Explain."}]},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "call_r2", "name": "read_file",
                                           "input": {"path": "missing.py"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "call_r2", "content": "no such file",
                                      "is_error": True}]},
    ]
    second = client.messages.create(model=MODEL, max_tokens=256, tools=[READ_TOOL], messages=messages,
                                    system="You are a coding agent.", tool_choice={"type": "any"})
    assert second.content[0].text == "It prints hi." and second.stop_reason == "end_turn"
    request = backend.requests[1]
    assert request.tool_choice == "required"
    assert request.messages == [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "<system-reminder>cwd: /src</system-reminder>\nShow a.py"},
        {"role": "assistant", "content": "", "reasoning_content": "Read it.", "tool_calls": [
            {"id": tool_use.id, "type": "function", "function": {"name": "read_file", "arguments": {"path": "a.py"}}}]},
        {"role": "tool", "tool_call_id": tool_use.id, "content": "print('hi')", "name": "read_file"},
        {"role": "user", "content": "Explain."},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_r2", "type": "function", "function": {"name": "read_file", "arguments": {"path": "missing.py"}}}]},
        {"role": "tool", "tool_call_id": "call_r2", "content": "Error: no such file", "name": "read_file"},
    ]


@pytest.mark.parametrize("done, reason, sequence", [
    (Done("stop"), "end_turn", None),
    (Done("length"), "max_tokens", None),
    (Done("stop_sequence", stop_sequence="END"), "stop_sequence", "END"),
    (Done("context"), "model_context_window_exceeded", None),
])
def test_stop_reasons(client, backend, done, reason, sequence):  # noqa: F811
    backend.script = [TextDelta("x"), done]
    message = client.messages.create(model=MODEL, max_tokens=5, messages=[{"role": "user", "content": "Hi"}])
    assert (message.stop_reason, message.stop_sequence) == (reason, sequence)
    with client.messages.stream(model=MODEL, max_tokens=5, messages=[{"role": "user", "content": "Hi"}]) as stream:
        final = stream.get_final_message()
    assert (final.stop_reason, final.stop_sequence) == (reason, sequence)


def test_tool_choice_and_thinking_options(client, backend):  # noqa: F811
    ask = [{"role": "user", "content": "Hi"}]
    client.messages.create(model=MODEL, max_tokens=5, messages=ask, tools=[READ_TOOL],
                           tool_choice={"type": "tool", "name": "read_file"}, thinking={"type": "disabled"})
    client.messages.create(model=MODEL, max_tokens=5, messages=ask, tools=[READ_TOOL], tool_choice={"type": "none"})
    client.messages.create(model=MODEL, max_tokens=5, messages=ask, tools=[READ_TOOL], tool_choice={"type": "auto"},
                           thinking={"type": "adaptive"}, output_config={"effort": "low"})
    named, none, auto = backend.requests
    assert named.tool_choice == {"type": "function", "function": {"name": "read_file"}} and named.think is False
    assert none.tools is None and none.tool_choice is None and none.think is None
    assert auto.tool_choice == "auto" and auto.tools is not None and auto.think is None


def test_count_tokens(client, backend):  # noqa: F811
    count = client.messages.count_tokens(model=MODEL, system="s", messages=[{"role": "user", "content": "Hi"}],
                                         tools=[READ_TOOL])
    assert count.input_tokens == 14
    assert backend.requests[0].tools[0]["function"]["name"] == "read_file"


def test_errors(client, base_url, backend):  # noqa: F811
    ask = [{"role": "user", "content": "Hi"}]
    r = httpx.post(base_url + "/v1/messages", json={"model": MODEL, "messages": ask}, headers=HEADERS)
    assert r.status_code == 400
    assert r.json() == {"type": "error", "error": {"type": "invalid_request_error",
                                                   "message": "max_tokens: field required, an integer >= 1"}}
    with pytest.raises(anthropic.NotFoundError) as e:
        client.messages.create(model="nope", max_tokens=5, messages=ask)
    assert e.value.status_code == 404 and e.value.body["error"]["type"] == "not_found_error"
    with pytest.raises(anthropic.NotFoundError):
        with client.messages.stream(model="nope", max_tokens=5, messages=ask) as stream:
            stream.get_final_message()
    with pytest.raises(anthropic.InternalServerError) as e:
        client.messages.create(model="busy", max_tokens=5, messages=ask)
    assert e.value.status_code == 503 and e.value.body["error"]["type"] == "overloaded_error"
    with pytest.raises(anthropic.BadRequestError, match="text only"):
        client.messages.create(model=MODEL, max_tokens=5, messages=[{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}]}])
    with pytest.raises(anthropic.BadRequestError, match="input_schema"):
        client.messages.create(model=MODEL, max_tokens=5, messages=ask,
                               tools=[{"type": "web_search_20250305", "name": "web_search"}])
    with pytest.raises(anthropic.NotFoundError):
        client.messages.count_tokens(model="nope", messages=ask)
    with pytest.raises(anthropic.BadRequestError, match=r"temperature: 1.5 is not in \[0, 1\]"):
        client.messages.create(model=MODEL, max_tokens=5, messages=ask, extra_body={"temperature": 1.5})
    with pytest.raises(anthropic.BadRequestError, match="must have non-empty content"):
        client.messages.create(model=MODEL, max_tokens=5, messages=[{"role": "user", "content": []}])


def test_error_mid_stream(client, backend):  # noqa: F811
    backend.script = [TextDelta("partial"), ServerError("generation failed: out of memory")]
    with pytest.raises(anthropic.APIStatusError, match="out of memory"):
        with client.messages.stream(model=MODEL, max_tokens=5, messages=[{"role": "user", "content": "Hi"}]) as stream:
            stream.get_final_message()


def test_fake_backend_is_shared():
    assert FakeBackend().list_models()[0].name == MODEL


def test_tiny_end_to_end(live_tiny):  # noqa: F811
    client = anthropic.Anthropic(base_url=live_tiny, api_key="unused", max_retries=0, timeout=120)
    ask = {"model": "tiny", "max_tokens": 6, "messages": [{"role": "user", "content": "Hello"}],
           "extra_body": {"temperature": 0}}
    message = client.messages.create(**ask)
    assert message.stop_reason in ("end_turn", "max_tokens") and 0 < message.usage.output_tokens <= 6
    with client.messages.stream(**ask) as stream:
        final = stream.get_final_message()
    assert [b.model_dump() for b in final.content] == [b.model_dump() for b in message.content]

    def context(usage) -> int:  # the prompt's tokens, as a coding agent sums them to track its context
        return usage.input_tokens + usage.cache_read_input_tokens + usage.cache_creation_input_tokens

    assert final.usage.cache_read_input_tokens > 0  # the same prompt again: its state kept but the last token
    assert context(final.usage) == context(message.usage)
    assert client.messages.count_tokens(model="tiny", messages=ask["messages"]).input_tokens == context(message.usage)
    body = {**{k: v for k, v in ask.items() if k != "extra_body"}, "temperature": 0, "stream": True}
    with httpx.stream("POST", live_tiny + "/v1/messages", json=body, headers=HEADERS, timeout=120) as r:
        first = next(json.loads(line.removeprefix("data: ")) for line in r.iter_lines() if line.startswith("data: "))
    assert first["type"] == "message_start"
    # known before the cache is looked up, so the whole prompt (the final usage splits it)
    assert first["message"]["usage"]["input_tokens"] == context(message.usage)



def test_a_final_assistant_message_is_continued(live_tiny, tmp_path):  # noqa: F811
    """Anthropic's prefill: the reply continues the final assistant message. The prompt is the
    new turn's with the message's text after it: no end of turn, no second assistant header."""
    from runtime.loading.registered import open_model
    from runtime.text.tokenizer import Tokenizer
    from tests.test_server_util import pulled_home

    tokenizer = Tokenizer.from_model(open_model(pulled_home(tmp_path), "tiny"))
    client = anthropic.Anthropic(base_url=live_tiny, api_key="unused", max_retries=0, timeout=120)
    user = [{"role": "user", "content": "Hello"}]
    prefilled = [*user, {"role": "assistant", "content": "Sure"}]
    new_turn = client.messages.count_tokens(model="tiny", messages=user).input_tokens
    continued = client.messages.count_tokens(model="tiny", messages=prefilled).input_tokens
    text = tokenizer.apply_chat_template(prefilled, add_generation_prompt=False, continue_final_message=True)
    assert text.endswith("Sure") and text.count("<|im_start|>assistant") == 1
    assert continued == len(tokenizer.encode(text))
    assert continued == new_turn + len(tokenizer.encode("Sure"))
    message = client.messages.create(model="tiny", max_tokens=4, messages=prefilled, extra_body={"temperature": 0})
    assert message.usage.input_tokens + message.usage.cache_read_input_tokens == continued
