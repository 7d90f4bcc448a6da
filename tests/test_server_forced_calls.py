"""tool_choice "required" or a named function: the reply opens as a tool call in the family's
syntax (runtime/server/forced_calls.py), through the real server and the `openai` and `anthropic`
clients. The model's continuation is scripted: the tiny model's random weights write no JSON."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from runtime.engine import Generation, GenerationStats, Session
from runtime.server.forced_calls import UnsupportedToolChoice, call_opening, forced_name
from runtime.server.parsers import make_parser
from runtime.server.parsers_deepseek import CALL_BEGIN, CALLS_BEGIN
from runtime.server.protocol import ToolCallEvent
from tests.test_server_util import LiveServer, pulled_home

openai = pytest.importorskip("openai")
anthropic = pytest.importorskip("anthropic")

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                           "required": ["city"]}}}
CLOCK = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}
XML_TEMPLATE = "{{ '<tool_call>\\n<function=' + name + '>' }}"


def test_forced_name_reads_both_apis_shapes() -> None:
    assert forced_name("required") == (True, None)
    assert forced_name({"type": "function", "function": {"name": "f"}}) == (True, "f")
    assert forced_name("auto") == forced_name(None) == (False, None)


@pytest.mark.parametrize(("family", "template", "name", "opening"), [
    ("qwen3_moe", "", "get_weather", '<tool_call>\n{"name": "get_weather", "arguments": '),
    ("qwen3_moe", "", None, "<tool_call>\n"),
    ("qwen3_moe", XML_TEMPLATE, "get_weather", "<tool_call>\n<function=get_weather>\n"),  # Qwen3-Coder
    ("qwen3_5_moe", XML_TEMPLATE, None, "<tool_call>\n"),
    ("glm4_moe", "", "get_weather", "<tool_call>get_weather"),
    ("deepseek_v3", "", None, CALLS_BEGIN + CALL_BEGIN),
    ("mixtral", "", None, "[TOOL_CALLS]"),
])
def test_the_opening_is_the_familys_own_syntax(family: str, template: str, name: str | None, opening: str) -> None:
    assert call_opening(family, template, name) == opening


@pytest.mark.parametrize(("family", "name"), [("deepseek_v3", "f"), ("mixtral", "f"), ("llama4", None), (None, None)])
def test_what_cannot_be_forced_is_refused_with_the_way_out(family: str | None, name: str | None) -> None:
    with pytest.raises(UnsupportedToolChoice, match="tool_choice (required|auto)"):
        call_opening(family, "", name)


@pytest.mark.parametrize(("family", "template", "rest"), [
    ("qwen3_moe", "", '{"city": "Paris"}}\n</tool_call>'),
    ("qwen3_moe", XML_TEMPLATE, "<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>"),
    ("glm4_moe", "", "\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n</tool_call>"),
])
def test_an_opening_and_its_continuation_parse_as_the_call(family: str, template: str, rest: str) -> None:
    parser = make_parser(family, [WEATHER])
    events = parser.feed(call_opening(family, template, "get_weather")) + parser.feed(rest) + parser.finish()
    assert [(e.name, e.arguments) for e in events if isinstance(e, ToolCallEvent)] == [("get_weather", {"city": "Paris"})]


@pytest.fixture(scope="module")
def scripted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, list[str]]]:
    """A live server over the tiny model whose generations write the next scripted text; the
    prompts they were given, decoded, in order."""
    prompts: list[str] = []
    script: list[str] = []

    def generate(self: Session, prompt: list[int], params: object, on_text=None, *, keep_special_tokens=False,
                 continues_text=False):
        prompts.append(self.tokenizer.decode(prompt) + ("" if continues_text else "[NEW TEXT]"))
        text = script.pop(0)
        if on_text is not None:
            on_text(text)
        return Generation(text, [], "stop", GenerationStats(eval_tokens=3))

    patch = pytest.MonkeyPatch()
    patch.setattr(Session, "generate", generate)
    with LiveServer(pulled_home(tmp_path_factory.mktemp("ft_home"))) as server:
        yield server.url, prompts, script
    patch.undo()


def test_openai_named_function_is_called(scripted) -> None:
    url, prompts, script = scripted
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=60)
    script.append('{"city": "Paris"}}\n</tool_call>')
    reply = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "Weather in Paris?"}], tools=[WEATHER, CLOCK],
        tool_choice={"type": "function", "function": {"name": "get_weather"}})
    assert prompts[-1].endswith('<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": ')  # goes on
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content in (None, "")
    call = choice.message.tool_calls[0].function
    assert call.name == "get_weather" and json.loads(call.arguments) == {"city": "Paris"}


def test_anthropic_any_tool_streams_a_tool_use(scripted) -> None:
    url, prompts, script = scripted
    client = anthropic.Anthropic(base_url=url, api_key="unused", max_retries=0, timeout=60)
    script.append('{"name": "get_time", "arguments": {}}\n</tool_call>')
    tools = [{"name": t["function"]["name"], "input_schema": t["function"]["parameters"]} for t in (WEATHER, CLOCK)]
    with client.messages.stream(model="tiny", max_tokens=64, tools=tools, tool_choice={"type": "any"},
                                messages=[{"role": "user", "content": "What time is it?"}]) as stream:
        message = stream.get_final_message()
    assert prompts[-1].endswith("<|im_start|>assistant\n<tool_call>\n")
    assert message.stop_reason == "tool_use"
    counted = client.messages.count_tokens(model="tiny", tools=tools, messages=[
        {"role": "user", "content": "What time is it?"}]).input_tokens
    assert message.usage.input_tokens == counted  # the opening ft wrote is the reply's, not the prompt's
    assert [(b.type, b.name, b.input) for b in message.content] == [("tool_use", "get_time", {})]


def test_auto_adds_no_opening(scripted) -> None:
    url, prompts, script = scripted
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=60)
    script.append("It is sunny.")
    reply = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Weather?"}],
                                           tools=[WEATHER])
    assert prompts[-1].endswith("<|im_start|>assistant\n[NEW TEXT]") and reply.choices[0].message.content == "It is sunny."


def test_raw_prompts_and_prefilled_replies_stream_as_continuations(scripted) -> None:
    """Their output goes on from the prompt's last words (a SentencePiece token's leading space is
    the space after the prompt's word), a chat turn's starts a text of its own."""
    import httpx

    url, prompts, script = scripted
    script.extend(["x", "y", "z"])
    client = anthropic.Anthropic(base_url=url, api_key="unused", max_retries=0, timeout=60)
    client.messages.create(model="tiny", max_tokens=4, messages=[
        {"role": "user", "content": "Capital of France?"}, {"role": "assistant", "content": "The capital is"}])
    assert prompts[-1].endswith("The capital is")  # (no "[NEW TEXT]": decoded after the prefill)
    httpx.post(url + "/api/generate", timeout=60, json={"model": "tiny", "prompt": "Once upon a", "raw": True,
                                                          "stream": False, "options": {"num_predict": 4}})
    assert prompts[-1].endswith("Once upon a")
    client.messages.create(model="tiny", max_tokens=4, messages=[{"role": "user", "content": "Hi"}])
    assert prompts[-1].endswith("[NEW TEXT]")
