"""POST /v1/responses (runtime/server/openai_responses.py), the API OpenAI's Codex CLI speaks,
through the real `openai` client: the request's instructions, input items and function tools as
the backend's ChatRequest; the backend's events as a response object and as the streamed event
sequence the client's accumulator checks; and the tiny model end to end."""

from __future__ import annotations

import openai
import pytest

from runtime.server.protocol import Done, ReasoningDelta, TextDelta, ToolCallEvent
from tests.test_server_openai import FakeBackend
from tests.test_server_util import serving

WEATHER = {"type": "function", "name": "get_weather", "description": "Weather at a place",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


@pytest.fixture(scope="module")
def served():
    from fastapi import FastAPI

    from runtime.server import openai_responses

    backend = FakeBackend()
    app = FastAPI()
    app.include_router(openai_responses.make_router(backend))
    with serving(app) as url:
        yield url, backend


@pytest.fixture
def client(served):
    served[1].reset()
    with openai.OpenAI(base_url=served[0] + "/v1", api_key="sk-test", max_retries=0) as c:
        yield c, served[1]


def test_a_plain_reply(client) -> None:
    c, backend = client
    reply = c.responses.create(model="tiny", instructions="Be brief.", input="Hi", max_output_tokens=20,
                               temperature=0.5)
    assert reply.output_text == "Hello world" and reply.status == "completed"
    assert (reply.usage.input_tokens, reply.usage.output_tokens) == (11, 2)
    request = backend.requests[-1]
    assert request.messages == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    assert request.options == {"max_tokens": 20, "temperature": 0.5}


def test_a_tool_round_trip_as_codex_sends_it(client) -> None:
    c, backend = client
    backend.script = [ReasoningDelta("Need the weather."), TextDelta("Checking."),
                      ToolCallEvent("call_abc", "get_weather", {"city": "Paris"}),
                      Done("tool_calls", prompt_tokens=30, completion_tokens=9, cached_tokens=12)]
    reply = c.responses.create(model="tiny", input=[{"role": "user", "content": [{"type": "input_text",
                                                                                   "text": "Weather in Paris?"}]}],
                               tools=[WEATHER, {"type": "web_search"}])
    kinds = [item.type for item in reply.output]
    assert kinds == ["reasoning", "message", "function_call"]
    call = reply.output[2]
    assert (call.call_id, call.name, call.arguments) == ("call_abc", "get_weather", '{"city": "Paris"}')
    assert reply.usage.input_tokens_details.cached_tokens == 12
    assert [t["function"]["name"] for t in backend.requests[-1].tools] == ["get_weather"]  # the hosted tool left out
    # the next turn: the call and its output sent back as items
    backend.reset()
    c.responses.create(model="tiny", input=[
        {"role": "user", "content": "Weather in Paris?"},
        {"type": "reasoning", "id": "rs_1", "summary": []},
        {"type": "function_call", "call_id": "call_abc", "name": "get_weather", "arguments": '{"city": "Paris"}'},
        {"type": "function_call_output", "call_id": "call_abc", "output": "sunny"}], tools=[WEATHER])
    assert backend.requests[-1].messages == [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_abc", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "tool_call_id": "call_abc", "content": "sunny", "name": "get_weather"}]


def test_the_stream_is_the_event_sequence_the_client_accumulates(client) -> None:
    c, backend = client
    backend.script = [ReasoningDelta("Think"), ReasoningDelta("ing."), TextDelta("Hel"), TextDelta("lo"),
                      ToolCallEvent("call_1", "get_weather", {"city": "Rome"}),
                      Done("tool_calls", prompt_tokens=8, completion_tokens=5)]
    with c.responses.stream(model="tiny", input="Hi", tools=[WEATHER]) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_response()
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    assert "response.output_text.delta" in kinds and "response.function_call_arguments.done" in kinds
    assert [item.type for item in final.output] == ["reasoning", "message", "function_call"]
    assert final.output_text == "Hello" and final.output[0].content[0].text == "Thinking."
    assert final.usage.output_tokens == 5


def test_a_cut_reply_is_incomplete_and_bad_requests_name_the_field(client) -> None:
    c, backend = client
    backend.script = [TextDelta("Hel"), Done("length", prompt_tokens=3, completion_tokens=1)]
    reply = c.responses.create(model="tiny", input="Hi", max_output_tokens=1)
    assert reply.status == "incomplete" and reply.incomplete_details.reason == "max_output_tokens"
    with pytest.raises(openai.BadRequestError, match="previous_response_id"):
        c.responses.create(model="tiny", input="Hi", previous_response_id="resp_1")
    with pytest.raises(openai.BadRequestError, match=r"input\[0\]\.content\[0\]"):
        c.responses.create(model="tiny", input=[{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}])
    with pytest.raises(openai.NotFoundError):
        c.responses.create(model="no-such-model", input="Hi")


def test_tiny_end_to_end(tmp_path_factory) -> None:
    from tests.test_server_util import LiveServer, pulled_home

    with LiveServer(pulled_home(tmp_path_factory.mktemp("responses-home"))) as server:
        c = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)
        reply = c.responses.create(model="tiny", input="Hello", max_output_tokens=6, temperature=0)
        assert reply.output[0].type == "message" and 0 < reply.usage.output_tokens <= 6
        events = list(c.responses.create(model="tiny", input="Hello", max_output_tokens=6, temperature=0,
                                         stream=True))
        last = events[-1]  # cut at max_output_tokens: response.incomplete, as the API ends such a stream
        assert last.type == ("response.incomplete" if reply.status == "incomplete" else "response.completed")
        assert last.response.output_text == reply.output_text
        usage = last.response.usage  # the same prompt again: all but its last token from the cache
        assert usage.input_tokens_details.cached_tokens == usage.input_tokens - 1
