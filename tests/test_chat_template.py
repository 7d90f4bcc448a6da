"""runtime.text.chat_template renders exactly what transformers' apply_chat_template renders.

The oracle is transformers' own renderer (`render_jinja_template`, after the message
normalization `apply_chat_template` does first), run on real model templates vendored under
tests/data/chat_templates/ (see SOURCES.md there) and on the built-in tiny model's template, over
a set of conversations: system/user/assistant turns, tools, tool calls and results, reasoning,
enable_thinking, unicode. Where transformers raises (a template refusing a conversation), we must
raise ChatTemplateError.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from transformers.utils.chat_template_utils import render_jinja_template

try:  # newer transformers normalize the messages before rendering
    from transformers.utils.chat_template_utils import _normalize_chat_messages
except ImportError:  # earlier 5.x (the GPU machine's) rendered them as given

    def _normalize_chat_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return messages

from ftpull.tiny import CHAT_TEMPLATE as TINY_TEMPLATE
from runtime.text.chat_template import ChatTemplateError, compile_template, plain_data, render_chat

TEMPLATE_DIR = Path(__file__).parent / "data" / "chat_templates"
QWEN_TOKENS = {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}
DEEPSEEK_TOKENS = {"bos_token": "<｜begin▁of▁sentence｜>", "eos_token": "<｜end▁of▁sentence｜>",
                   "pad_token": "<｜end▁of▁sentence｜>"}
GLM_TOKENS = {"eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>"}
FAMILY_TOKENS = {
    "qwen3": QWEN_TOKENS,
    "qwen3_5": QWEN_TOKENS,
    "deepseek_v3": DEEPSEEK_TOKENS,
    "deepseek_v3_1": DEEPSEEK_TOKENS,
    "glm_4_5": GLM_TOKENS,
    "glm_5_3_flash": GLM_TOKENS,
    "mixtral": {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"},
}

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city — «quoted» & <b>bold</b>",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city"],
        },
    },
}
TIME_TOOL = {"type": "function", "function": {"name": "now", "description": "Current time",
                                              "parameters": {"type": "object", "properties": {}}}}
ARGS = {"city": "Zürich", "days": 2}
CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": ARGS}}
CALL_JSON = {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": json.dumps(ARGS, ensure_ascii=False)}}
CALL_2 = {"id": "call_2", "type": "function", "function": {"name": "now", "arguments": {}}}
SYSTEM = {"role": "system", "content": "You are terse."}
USER = {"role": "user", "content": "What's the weather in Zürich? 😀"}

# (name, messages, keyword arguments)
CASES: list[tuple[str, list[dict[str, Any]], dict[str, Any]]] = [
    ("user", [USER], {}),
    ("user_no_generation_prompt", [USER], {"add_generation_prompt": False}),
    ("system_multi_turn", [SYSTEM, {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."},
                           {"role": "user", "content": "Again"}], {}),
    ("tools", [SYSTEM, USER], {"tools": [WEATHER_TOOL, TIME_TOOL]}),
    ("tools_no_system", [USER], {"tools": [WEATHER_TOOL]}),
    ("tool_calls_and_results", [
        USER,
        {"role": "assistant", "content": "Let me check.", "tool_calls": [CALL, CALL_2]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18°C, sunny"},
        {"role": "tool", "tool_call_id": "call_2", "content": "12:00"},
    ], {"tools": [WEATHER_TOOL, TIME_TOOL]}),
    ("openai_tool_call", [
        USER,
        {"role": "assistant", "content": None, "tool_calls": [CALL_JSON]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18°C"},
        {"role": "assistant", "content": "It is 18°C."},
        {"role": "user", "content": "Thanks"},
    ], {"tools": [WEATHER_TOOL]}),
    ("tool_call_string_arguments", [
        USER,
        {"role": "assistant", "content": "", "tool_calls": [CALL_JSON]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18°C"},
        {"role": "assistant", "content": "It is 18°C."},
    ], {"tools": [WEATHER_TOOL], "add_generation_prompt": False}),
    ("reasoning_content", [USER, {"role": "assistant", "reasoning_content": "The user wants weather.",
                                  "content": "Sunny."}], {"add_generation_prompt": False}),
    ("reasoning_old_turn", [USER, {"role": "assistant", "reasoning_content": "hidden", "content": "Sunny."},
                            {"role": "user", "content": "And tomorrow?"}], {}),
    ("reasoning_inline", [USER, {"role": "assistant", "content": "<think>\nhmm\n</think>\n\nSunny."}],
     {"add_generation_prompt": False}),
    ("reasoning_alias", [USER, {"role": "assistant", "reasoning": "aliased", "content": "Sunny."}],
     {"add_generation_prompt": False}),
    ("thinking_off", [USER], {"enable_thinking": False}),
    ("thinking_on", [USER], {"enable_thinking": True}),
    ("unicode", [{"role": "user", "content": "中文 «ü» \"quotes\" \\ back\nslash\ttab 🎉"}], {}),
    ("content_parts", [{"role": "user", "content": [{"type": "text", "text": "part one "},
                                                    {"type": "text", "text": "part two"}]}], {}),
    ("roles_not_alternating", [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}], {}),
]


def hf_render(template: str, messages: list[dict], *, special_tokens: dict | None = None,
              add_generation_prompt: bool = True, **kwargs: Any) -> str:
    """What `tokenizer.apply_chat_template(messages, tokenize=False, ...)` renders."""
    tools = kwargs.pop("tools", None)
    documents = kwargs.pop("documents", None)
    continue_final_message = kwargs.pop("continue_final_message", False)
    rendered, _ = render_jinja_template(
        conversations=[_normalize_chat_messages(messages)], tools=tools, documents=documents,
        chat_template=template, add_generation_prompt=add_generation_prompt,
        continue_final_message=continue_final_message, **{**(special_tokens or {}), **kwargs})
    return rendered[0]


def same_as_transformers(template: str, messages: list[dict], **kwargs: Any) -> str | None:
    """Render with both; equal text, or both refuse. Returns the text (None when refused)."""
    try:
        expected = hf_render(template, messages, **kwargs)
    except Exception:
        with pytest.raises(ChatTemplateError):
            render_chat(template, messages, **kwargs)
        return None
    assert render_chat(template, messages, **kwargs) == expected
    return expected


@pytest.mark.parametrize("family", sorted(FAMILY_TOKENS))
def test_real_templates_match_transformers(family: str) -> None:
    template = (TEMPLATE_DIR / f"{family}.jinja").read_text(encoding="utf-8")
    rendered = {}
    for name, messages, kwargs in CASES:
        rendered[name] = same_as_transformers(template, messages, special_tokens=FAMILY_TOKENS[family], **kwargs)
    ok = [name for name, text in rendered.items() if text is not None]
    assert len(ok) >= 6, f"{family}: only {ok} rendered"  # the comparison must not be vacuous
    # the variations really reach the template (Mixtral's ignores add_generation_prompt)
    if "add_generation_prompt" in template and rendered["user"] and rendered["user_no_generation_prompt"]:
        assert rendered["user"] != rendered["user_no_generation_prompt"]


def test_real_template_details() -> None:
    """Spot checks that the vendored templates and inputs exercise what they should."""
    qwen = (TEMPLATE_DIR / "qwen3.jinja").read_text(encoding="utf-8")
    text = render_chat(qwen, [USER], tools=[WEATHER_TOOL], special_tokens=QWEN_TOKENS)
    assert '"description": "Weather for a city — «quoted» & <b>bold</b>"' in text  # no escaping
    off = render_chat(qwen, [USER], special_tokens=QWEN_TOKENS, enable_thinking=False)
    assert off.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    deepseek = (TEMPLATE_DIR / "deepseek_v3.jinja").read_text(encoding="utf-8")
    assert render_chat(deepseek, [SYSTEM, USER], special_tokens=DEEPSEEK_TOKENS).startswith(
        "<｜begin▁of▁sentence｜>You are terse.<｜User｜>")
    glm = (TEMPLATE_DIR / "glm_4_5.jinja").read_text(encoding="utf-8")
    call = render_chat(glm, [USER, {"role": "assistant", "content": "", "tool_calls": [CALL]}],
                       add_generation_prompt=False)
    assert "<arg_key>city</arg_key>\n<arg_value>Zürich</arg_value>" in call
    assert "<arg_value>2</arg_value>" in call


def test_tiny_template_matches_transformers() -> None:
    tokens = {"bos_token": "<|endoftext|>", "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}
    for _, messages, kwargs in CASES:
        same_as_transformers(TINY_TEMPLATE, messages, special_tokens=tokens, **kwargs)


@pytest.mark.parametrize("template", [
    "{{ x | tojson }}",
    "{{ x | tojson(indent=2) }}",
    "{{ x | tojson(separators=(',', ':'), sort_keys=true) }}",
    "{{ x | tojson(ensure_ascii=true) }}",
    "{% for k, v in x|items %}{{ k }}={{ v }};{% endfor %}",
    "{% for m in messages %}{% if loop.index0 == 1 %}{% continue %}{% endif %}{{ m.content }}"
    "{% if loop.index0 == 2 %}{% break %}{% endif %}{% endfor %}",
    "{% for m in messages %}{% generation %}[{{ m.content }}]{% endgeneration %}{% endfor %}",
    "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}{% endfor %}{{ ns.n }}",
    "{{ dict(a=1, b=2) | tojson }}{{ dict.fromkeys(['x'], 0) | tojson }}",
    "{%- if true %}\n    {{- 'a' }}\n{%- endif %}\n  {% if true %}\nb\n  {% endif %}\nc",
    "{{ bos_token }}|{{ eos_token }}|{{ add_generation_prompt }}|{{ tools }}|{{ documents }}",
    "{% for d in documents %}<{{ d.title }}:{{ d.text }}>{% endfor %}",
    "{{ messages[0].content is defined }}{{ messages[0].keys() | list | tojson }}",
    "{{ messages[1].reasoning_content }}/{{ messages[1].thinking }}",
    "{{ 'ab' * 3 }}{{ 2 ** 10 }}{{ [1] * 2 }}",
])
def test_jinja_semantics_match_transformers(template: str) -> None:
    messages = [{"role": "user", "content": None, "name": "x"},
                {"role": "assistant", "content": "b", "reasoning": "r"},
                {"role": "user", "content": "c"}, {"role": "assistant", "content": "d"}]
    x = {"b": "é<>&'\"", "a": [1, 2.5, None, True], "c": {"z": "中"}}
    documents = [{"title": "T1", "text": "one"}, {"title": "T2", "text": "two"}]
    text = same_as_transformers(template, messages, x=x, documents=documents,
                                special_tokens={"bos_token": "<s>", "eos_token": "</s>"})
    assert text is not None


def test_continue_final_message_matches_transformers() -> None:
    qwen = (TEMPLATE_DIR / "qwen3.jinja").read_text(encoding="utf-8")
    messages = [USER, {"role": "assistant", "content": "It is "}]
    text = same_as_transformers(qwen, messages, special_tokens=QWEN_TOKENS, add_generation_prompt=False,
                                continue_final_message=True)
    assert text is not None and text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\nIt is ")
    with pytest.raises(ChatTemplateError, match="cannot both"):
        render_chat(qwen, messages, add_generation_prompt=True, continue_final_message=True)


def test_strftime_now() -> None:
    assert render_chat("{{ strftime_now('%Y') }}", [USER]) == str(datetime.now().year)


@pytest.mark.parametrize("template", [
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{{ messages.__class__ }}",
    "{{ cycler.__init__.__globals__ }}",
    "{{ raise_exception.__globals__ }}",
    "{{ namespace.__init__.__globals__['os'] }}",
    "{% set ns = namespace(_secret=1) %}",
    "{% set ns = namespace() %}{% set ns._x = 1 %}",
    "{{ messages.append(1) }}",
    "{{ messages[0].update(role='system') }}",
    "{{ dict.__class__ }}",
    "{{ self._TemplateReference__context }}",
    "{{ 'a' * 1000000000 }}",
    "{{ [0] * (2 ** 40) }}",
    "{{ 7 ** 1000000 }}",
    "{{ range(10000000) | list }}",
])
def test_malicious_templates_reach_nothing(template: str) -> None:
    """The sandbox either refuses or, for a bare unsafe attribute, yields an empty Undefined."""
    try:
        text = render_chat(template, [USER])
    except ChatTemplateError:
        return
    assert text == ""
    with pytest.raises(ChatTemplateError, match="unsafe"):  # any use of what it got is refused
        render_chat(template.replace(" }}", ".__name__ }}"), [USER])


def test_error_messages_name_the_problem() -> None:
    with pytest.raises(ChatTemplateError, match="refused the conversation: roles must alternate"):
        render_chat("{{ raise_exception('roles must alternate') }}", [USER])
    with pytest.raises(ChatTemplateError, match="syntax error on line 2"):
        render_chat("ok\n{% if %}", [USER])
    with pytest.raises(ChatTemplateError, match="unsafe"):
        render_chat("{{ ''.__class__.__mro__ }}", [USER])
    with pytest.raises(ChatTemplateError, match="TypeError"):
        render_chat("{{ 'a' + 1 }}", [USER])
    with pytest.raises(ChatTemplateError, match="UndefinedError"):
        render_chat("{{ nothing.at.all }}", [USER])
    with pytest.raises(ChatTemplateError, match="empty conversation"):
        render_chat("x", [])
    with pytest.raises(ChatTemplateError, match="message 1 must be a dict"):
        render_chat("x", [USER, "hello"])
    with pytest.raises(ChatTemplateError, match="tools must be a list"):
        render_chat("x", [USER], tools={"type": "function"})
    with pytest.raises(ChatTemplateError, match=r"tools\[0\] must be a dict"):
        render_chat("x", [USER], tools=["get_weather"])
    with pytest.raises(ChatTemplateError, match="must be a string"):
        render_chat(None, [USER])  # type: ignore[arg-type]


def test_inputs_are_not_modified_and_compiles_are_cached() -> None:
    messages = [{"role": "user", "content": "a", "extra": None}, {"role": "assistant", "content": "b", "reasoning": "r"}]
    before = json.dumps(messages)
    render_chat("{% for m in messages %}{{ m.content }}{% endfor %}", messages, continue_final_message=False)
    assert json.dumps(messages) == before
    assert compile_template("{{ 1 }}") is compile_template("{{ 1 }}")


def test_plain_data_strips_rich_objects() -> None:
    class Name(str):
        def dangerous(self) -> None: ...

    data = plain_data({"a": Name("x"), "b": (1, object()), "c": 1.5})
    assert type(data["a"]) is str and data["b"][1] == "<object>" and data["c"] == 1.5
