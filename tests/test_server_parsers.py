"""Output parsers: every family's reasoning and tool-call syntax, fed whole, character by
character, split at every position and at random, with the turns the real chat templates render
parsed back into the message they came from."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from runtime.server.parsers import FORMATS, PlainParser, make_parser, opens_reasoning, syntax_for
from runtime.server.parsers_deepseek import CALL_BEGIN, CALL_END, CALLS_BEGIN, CALLS_END, SEP
from runtime.server.protocol import ReasoningDelta, TextDelta, ToolCallEvent
from runtime.text.chat_template import render_chat

TEMPLATES = Path(__file__).parent / "data" / "chat_templates"
EOS_DS = "<\uff5cend\u2581of\u2581sentence\uff5c>"

WEATHER_TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather at a place",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "zip": {"type": "string"}, "days": {"type": "integer"},
        "units": {"type": "object"}}}}}]


def summarize(events):
    """Events with adjacent deltas merged and tool calls as ("tool", name, arguments)."""
    out = []
    for event in events:
        if isinstance(event, ToolCallEvent):
            assert event.id.startswith("call_") and len(event.id) > 10
            out.append(("tool", event.name, event.arguments))
            continue
        kind = "text" if isinstance(event, TextDelta) else "reasoning"
        assert isinstance(event, (TextDelta, ReasoningDelta)) and event.text, event
        if out and out[-1][0] == kind:
            out[-1] = (kind, out[-1][1] + event.text)
        else:
            out.append((kind, event.text))
    return out


def run(family, pieces, tools=True, starts_in_reasoning=False):
    parser = make_parser(family, tools, starts_in_reasoning=starts_in_reasoning)
    events = []
    for piece in pieces:
        events += parser.feed(piece)
    events += parser.finish()
    return summarize(events)


def splittings(text, seed=0, random_count=40):
    yield [text]
    yield list(text)
    for i in range(len(text) + 1):
        yield [text[:i], text[i:]]
    rng = random.Random(seed)
    for _ in range(random_count):
        cuts = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, rng.randint(1, 12))))
        yield [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]


def check_all_splits(family, text, expected, **kwargs):
    for pieces in splittings(text):
        assert run(family, pieces, **kwargs) == expected, pieces


DS_V3_CALLS = (CALLS_BEGIN + CALL_BEGIN + "function" + SEP + 'get_weather\n```json\n{"city": "Paris", "days": 2}\n```'
               + CALL_END + "\n" + CALL_BEGIN + "function" + SEP + "get_time\n```json\n{}\n```" + CALL_END + CALLS_END)
DS_V31_CALLS = (CALLS_BEGIN + CALL_BEGIN + 'get_weather' + SEP + '{"city": "Paris", "days": 2}' + CALL_END
                + CALL_BEGIN + "get_time" + SEP + "{}" + CALL_END + CALLS_END)
PARIS = ("tool", "get_weather", {"city": "Paris", "days": 2})
TIME = ("tool", "get_time", {})

CASES = {
    "qwen3 reasoning, text, two calls": (
        "qwen3_moe",
        '<think>\nThe user wants weather.\nCall it.\n</think>\n\nLet me check.\n<tool_call>\n{"name": "get_weather", '
        '"arguments": {"city": "Paris", "days": 2}}\n</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": {}}\n'
        "</tool_call>",
        {},
        [("reasoning", "The user wants weather.\nCall it."), ("text", "Let me check."), PARIS, TIME]),
    "qwen3 nested arguments and an end tag inside a string": (
        "qwen3_moe",
        '<tool_call>\n{"name": "write", "arguments": {"path": "a.xml", "text": "x</tool_call>y", '
        '"opts": {"mode": [1, {"deep": null}]}, "emoji": "é✓"}}\n</tool_call>',
        {},
        [("tool", "write", {"path": "a.xml", "text": "x</tool_call>y", "opts": {"mode": [1, {"deep": None}]},
                            "emoji": "é✓"})]),
    "qwen3 thinking opened by the prompt": (
        "qwen3_moe", "Hmm, 2+2.\n</think>\n\nIt is 4.", {"starts_in_reasoning": True},
        [("reasoning", "Hmm, 2+2."), ("text", "It is 4.")]),
    "qwen3 empty think block": (
        "qwen3_moe", "<think>\n\n</think>\n\nHello!", {}, [("text", "Hello!")]),
    "qwen3 arguments as a JSON string": (
        "qwen3_moe", '<tool_call>{"name": "f", "arguments": "{\\"a\\": 1}"}</tool_call>', {}, [("tool", "f", {"a": 1})]),
    "qwen3.5 XML calls, typed by schema": (
        "qwen3_5_moe",
        "Need weather.\n</think>\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nNew York\n</parameter>\n"
        "<parameter=zip>\n10001\n</parameter>\n<parameter=days>\n3\n</parameter>\n<parameter=units>\n"
        '{"temp": "c"}\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=get_time>\n</function>\n'
        "</tool_call>",
        {"starts_in_reasoning": True, "tools": WEATHER_TOOLS},
        [("reasoning", "Need weather."),
         ("tool", "get_weather", {"city": "New York", "zip": "10001", "days": 3, "units": {"temp": "c"}}), TIME]),
    "qwen3.5 XML multi-line value, no schema": (
        "qwen3_5_moe",
        "<tool_call>\n<function=write>\n<parameter=text>\nline 1\n\nline 3\n</parameter>\n<parameter=n>\n7\n"
        "</parameter>\n</function>\n</tool_call>",
        {}, [("tool", "write", {"text": "line 1\n\nline 3", "n": 7})]),
    "glm-4.5": (
        "glm4_moe",
        "\n<think>Weather needed.</think>\nChecking.\n<tool_call>get_weather\n<arg_key>city</arg_key>\n"
        "<arg_value>Paris</arg_value>\n<arg_key>days</arg_key>\n<arg_value>2</arg_value>\n</tool_call>",
        {"tools": WEATHER_TOOLS},
        [("reasoning", "Weather needed."), ("text", "Checking."), PARIS]),
    "glm-5 compact, reasoning opened by the prompt": (
        "glm_moe_dsa",
        "Weather needed.</think><tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value>"
        "<arg_key>days</arg_key><arg_value>2</arg_value></tool_call><tool_call>get_time</tool_call>",
        {"starts_in_reasoning": True},
        [("reasoning", "Weather needed."), PARIS, TIME]),
    "deepseek-v3 fenced calls after reasoning": (
        "deepseek_v3", "<think>\nLook it up.\n</think>\n\nSure." + DS_V3_CALLS, {},
        [("reasoning", "Look it up."), ("text", "Sure."), PARIS, TIME]),
    "deepseek-v3.1 calls": ("deepseek_v3", DS_V31_CALLS, {}, [PARIS, TIME]),
    "deepseek-r1 reasoning opened by the prompt": (
        "deepseek_v3", "Think.\n</think>\n\nDone.", {"starts_in_reasoning": True},
        [("reasoning", "Think."), ("text", "Done.")]),
    "mixtral JSON array": (
        "mixtral",
        ' [TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}, '
        '{"name": "get_time", "arguments": {}}]',
        {}, [PARIS, TIME]),
    "mistral v11 calls": (
        "mistral", 'Ok.[TOOL_CALLS]get_weather[ARGS]{"city": "Paris", "days": 2}[TOOL_CALLS]get_time[ARGS]{}', {},
        [("text", "Ok."), PARIS, TIME]),
    "malformed JSON stays text": (
        "qwen3_moe", 'Try:\n<tool_call>\n{"name": "f", "arguments": {"x": }\n</tool_call>', {},
        [("text", 'Try:\n<tool_call>\n{"name": "f", "arguments": {"x": }\n</tool_call>')]),
    "malformed call, then a good one": (
        "qwen3_moe", '<tool_call>{oops}</tool_call> then <tool_call>{"name": "get_time", "arguments": {}}</tool_call> end',
        {}, [("text", "<tool_call>{oops}</tool_call> then"), TIME, ("text", " end")]),  # (its space kept)
    "truncated call stays text": (
        "qwen3_moe", 'A\n<tool_call>\n{"name": "f", "argu', {}, [("text", 'A\n<tool_call>\n{"name": "f", "argu')]),
    "a complete call without its end tag": (
        "qwen3_moe", '<tool_call>\n{"name": "get_time", "arguments": {}}\n', {}, [TIME]),
    "tools off: tags are text": (
        "qwen3_moe", '<think>r</think>\n\n<tool_call>{"name": "f", "arguments": {}}</tool_call>', {"tools": False},
        [("reasoning", "r"), ("text", '<tool_call>{"name": "f", "arguments": {}}</tool_call>')]),
    "reasoning cut off by max_tokens": (
        "qwen3_moe", "<think>\nStill thinking about", {}, [("reasoning", "Still thinking about")]),
    "<think> after text is text": (
        "qwen3_moe", "Use <think> tags.", {}, [("text", "Use <think> tags.")]),
    "partial tag at the end is text": (
        "qwen3_moe", "Type <tool_ca", {}, [("text", "Type <tool_ca")]),
    "glm prose after the tag is not a call": (
        "glm4_moe", "<tool_call>is how I would call it</tool_call>", {},
        [("text", "<tool_call>is how I would call it</tool_call>")]),
    "deepseek garbage section is text": (
        "deepseek_v3", "x" + CALLS_BEGIN + "nonsense" + CALLS_END, {}, [("text", "x" + CALLS_BEGIN + "nonsense" + CALLS_END)]),
    "mixtral malformed is text": (
        "mixtral", '[TOOL_CALLS] [{"name": "f", "arguments": {', {}, [("text", '[TOOL_CALLS] [{"name": "f", "arguments": {')]),
    "text keeps its own whitespace": (
        "qwen3_moe", "  Indented\n\ncode:\n    x = 1\n", {}, [("text", "  Indented\n\ncode:\n    x = 1\n")]),
}


@pytest.mark.parametrize("name", list(CASES))
def test_every_split_gives_the_same_events(name):
    family, text, kwargs, expected = CASES[name]
    check_all_splits(family, text, expected, **kwargs)


@pytest.mark.parametrize("family", ["plain", "llama", None, ""])
def test_unknown_families_pass_text_through(family):
    text = "<think>x</think> <tool_call>{}</tool_call>  \n"
    assert isinstance(make_parser(family, True), PlainParser)
    for pieces in splittings(text):
        assert run(family, pieces) == [("text", text)]


def test_holds_back_only_what_could_be_a_tag():
    parser = make_parser("qwen3_moe", True)
    assert summarize(parser.feed("<think>a < b")) == [("reasoning", "a < b")]
    assert summarize(parser.feed("</th")) == []
    assert summarize(parser.feed("ink>\n\nx < y and <tool")) == [("text", "x < y and")]
    assert summarize(parser.feed("s>")) == [("text", " <tools>")]
    assert summarize(parser.finish()) == []


def test_every_family_resolves():
    for family in FORMATS:
        assert syntax_for(family) is not None


@pytest.mark.parametrize("prompt, family, expected", [
    ("<|im_start|>assistant\n<think>\n", "qwen3_5_moe", True),
    ("<|im_start|>assistant\n<think>\n\n</think>\n\n", "qwen3_moe", False),
    ("<|im_start|>assistant\n", "qwen3_moe", False),
    ("<|assistant|><think>", "glm_moe_dsa", True),
    ("<\uff5cAssistant\uff5c><think>", "deepseek_v3", True),
    ("<\uff5cAssistant\uff5c></think>", "deepseek_v3", False),
    ("[INST] hi [/INST]", "mixtral", False),
    ("<think>", "unknown", False),
])
def test_opens_reasoning(prompt, family, expected):
    assert opens_reasoning(family, prompt) is expected


# -- the real templates' rendering of an assistant turn parses back into that turn --

ASSISTANT = {
    "role": "assistant", "reasoning_content": "The user wants the weather.", "content": "Let me check.",
    "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": {
            "city": "Paris", "zip": "75001", "days": 2, "units": {"temp": "c"}}}},
        {"id": "call_2", "type": "function", "function": {"name": "get_time", "arguments": {}}},
    ],
}


def _with_string_arguments(message):
    calls = [{**c, "function": {**c["function"], "arguments": json.dumps(c["function"]["arguments"])}}
             for c in message["tool_calls"]]
    return {**message, "tool_calls": calls}


# template, family, string arguments (DeepSeek templates concatenate them), where the turn starts,
# where it ends, whether the template keeps reasoning of the last turn
TEMPLATE_CASES = [
    ("qwen3.jinja", "qwen3_moe", False, "<|im_start|>assistant\n", "<|im_end|>", True),
    ("qwen3_5.jinja", "qwen3_5_moe", False, "<|im_start|>assistant\n", "<|im_end|>", True),
    ("glm_4_5.jinja", "glm4_moe", False, "<|assistant|>", None, True),
    ("glm_5_3_flash.jinja", "glm_moe_dsa", False, "<|assistant|>", None, True),
    ("deepseek_v3.jinja", "deepseek_v3", True, "<\uff5cAssistant\uff5c>", EOS_DS, False),
    ("deepseek_v3_1.jinja", "deepseek_v3", True, "<\uff5cAssistant\uff5c></think>", EOS_DS, False),
]


@pytest.mark.parametrize("template, family, string_arguments, start, end, keeps_reasoning", TEMPLATE_CASES)
def test_rendered_turns_parse_back(template, family, string_arguments, start, end, keeps_reasoning):
    assistant = _with_string_arguments(ASSISTANT) if string_arguments else ASSISTANT
    messages = [{"role": "user", "content": "Weather in Paris?"}, assistant]
    rendered = render_chat((TEMPLATES / template).read_text(), messages, tools=WEATHER_TOOLS,
                           add_generation_prompt=False, special_tokens={"bos_token": "", "eos_token": ""})
    turn = rendered[rendered.rindex(start) + len(start):]
    turn = turn[: turn.index(end)] if end else turn
    expected = [("reasoning", ASSISTANT["reasoning_content"])] if keeps_reasoning else []
    expected += [("text", "Let me check.")]
    expected += [("tool", c["function"]["name"], c["function"]["arguments"]) for c in ASSISTANT["tool_calls"]]
    for pieces in splittings(turn, random_count=10):
        assert run(family, pieces, tools=WEATHER_TOOLS) == expected, turn


def test_tiny_model_template_round_trip():
    from ftpull.tiny import CHAT_TEMPLATE

    messages = [{"role": "user", "content": "Weather?"}, ASSISTANT]
    rendered = render_chat(CHAT_TEMPLATE, messages, tools=WEATHER_TOOLS, add_generation_prompt=False)
    turn = rendered[rendered.rindex("<|im_start|>assistant\n") + len("<|im_start|>assistant\n"):]
    turn = turn[: turn.index("<|im_end|>")]
    expected = [("reasoning", ASSISTANT["reasoning_content"]), ("text", "Let me check.")]
    expected += [("tool", c["function"]["name"], c["function"]["arguments"]) for c in ASSISTANT["tool_calls"]]
    for pieces in splittings(turn, random_count=10):
        assert run("qwen3_moe", pieces) == expected


WRITE_TOOL = [{"type": "function", "function": {"name": "write_file", "parameters": {
    "type": "object", "properties": {"path": {"type": "string"}, "content": {"type": "string"}}}}}]
WRITE_CALL = ("Writing it.\n<tool_call>\n<function=write_file>\n<parameter=path>\nmain.py\n</parameter>\n"
              "<parameter=content>\nprint(1)\n</parameter>\n</function>\n</tool_call>")


@pytest.mark.parametrize("cut", ["<parameter=content>", "<parameter=path>", "</tool_call>"])
def test_a_tool_call_cut_off_by_max_tokens_is_text_not_a_call(cut: str) -> None:
    """Output that ends at max_tokens inside a tool call: the call is missing arguments (or more),
    so it is text; the same output ended by the model itself gives its call."""
    text = WRITE_CALL[: WRITE_CALL.index(cut)]
    parser = make_parser("qwen3_5_moe", WRITE_TOOL)
    events = parser.feed(text) + parser.finish(truncated=True)
    assert not any(isinstance(e, ToolCallEvent) for e in events)
    assert "".join(e.text for e in events if isinstance(e, TextDelta)).strip() == text.strip()  # all of it, as text
    parser = make_parser("qwen3_5_moe", WRITE_TOOL)
    whole = parser.feed(WRITE_CALL) + parser.finish(truncated=True)  # complete before the cut: still a call
    assert [e.name for e in whole if isinstance(e, ToolCallEvent)] == ["write_file"]


def test_glms_bare_name_calls_are_glms_only() -> None:
    """Prose about the tags ("wrap calls in <tool_call>search</tool_call>") from a Qwen model was
    read as a GLM-style bare-name call of `search`; GLM's own families still read that shape."""
    prose = "Wrap calls in <tool_call>search</tool_call> tags."
    parser = make_parser("qwen3_moe", WRITE_TOOL)
    events = parser.feed(prose) + parser.finish()
    assert not any(isinstance(e, ToolCallEvent) for e in events)
    assert "".join(e.text for e in events if isinstance(e, TextDelta)).replace(" ", "") == prose.replace(" ", "")
    parser = make_parser("qwen3_moe", WRITE_TOOL)  # its own shapes are still calls
    call = '<tool_call>\n{"name": "write_file", "arguments": {"path": "a"}}\n</tool_call>'
    assert [e.name for e in parser.feed(call) + parser.finish() if isinstance(e, ToolCallEvent)] == ["write_file"]
    parser = make_parser("glm_moe_dsa", WRITE_TOOL)
    glm = "<tool_call>write_file<arg_key>path</arg_key><arg_value>a</arg_value></tool_call>"
    assert [(e.name, e.arguments) for e in parser.feed(glm) + parser.finish()
            if isinstance(e, ToolCallEvent)] == [("write_file", {"path": "a"})]


def test_text_on_both_sides_of_a_call_keeps_what_separated_it() -> None:
    """OpenAI's and Ollama's content joins the text runs around a call: "Let me look." and
    "Done." came out as "Let me look.Done."; the whitespace after the call now separates them
    (and a call with no text before it still drops it)."""
    parser = make_parser("qwen3_moe", True)
    call = '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'
    events = parser.feed(f"Let me look.\n{call}\nDone.") + parser.finish()
    assert "".join(e.text for e in events if isinstance(e, TextDelta)) == "Let me look.\nDone."
    parser = make_parser("qwen3_moe", True)
    events = parser.feed(f"{call}\n") + parser.finish()
    assert not [e for e in events if isinstance(e, TextDelta)]


@pytest.mark.parametrize(("family", "stray"), [("qwen3_moe", "I emit <tool_call> blocks. "),
                                                ("deepseek_v3", f"see {CALLS_BEGIN} here. ")])
def test_a_stray_start_tag_does_not_swallow_the_call_after_it(family: str, stray: str) -> None:
    """A start tag in prose opened a section that only ended at the real call's end tag, and
    the whole of it, the real call included, came out as text."""
    call = ('<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>' if family == "qwen3_moe"
            else f"{CALLS_BEGIN}{CALL_BEGIN}function{SEP}get_time\n```json\n{{}}\n```{CALL_END}{CALLS_END}")
    for pieces in splittings(stray + call, random_count=10):
        events = run(family, pieces)
        assert events == [("text", stray.rstrip()), ("tool", "get_time", {})], events
