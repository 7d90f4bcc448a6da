"""Ollama's Go chat templates translated to Jinja (ftpull/go_template.py), rendered by ft's renderer.

Oracle: Ollama's template.Execute (template/template.go), followed by hand on each conversation:
`.Messages` collated (consecutive messages of one role merged with "\\n\\n"; system messages
stay in them), `.System` every system message joined; a legacy template (no `.Messages`) run
once per exchange, the last one cut after `{{ .Response }}`; Go's `{{- -}}` trimming; struct
values (a tool's function, a call's arguments) printed as their compact JSON. The templates are
Ollama's library templates (qwen2.5's with tools) and the shapes Modelfiles written for it take.
"""

from __future__ import annotations

import pytest

from ftpull.go_template import GoTemplateError, looks_like_go, to_jinja
from ftpull.modelfile import parse_modelfile
from runtime.text.chat_template import render_chat

CHATML = '{{- if .System }}<|im_start|>system\n{{ .System }}<|im_end|>\n{{ end }}{{ range .Messages }}<|im_start|>{{ .Role }}\n{{ .Content }}<|im_end|>\n{{ end }}<|im_start|>assistant\n'
LLAMA3 = '{{- if .System }}<|start_header_id|>system<|end_header_id|>\n\n{{ .System }}<|eot_id|>\n{{- end }}\n{{- range .Messages }}<|start_header_id|>{{ .Role }}<|end_header_id|>\n\n{{ .Content }}<|eot_id|>\n{{- end }}<|start_header_id|>assistant<|end_header_id|>\n\n'
LEGACY = '{{ if .System }}<|im_start|>system\n{{ .System }}<|im_end|>\n{{ end }}{{ if .Prompt }}<|im_start|>user\n{{ .Prompt }}<|im_end|>\n{{ end }}<|im_start|>assistant\n{{ .Response }}<|im_end|>\n'
MISTRAL = '[INST] {{ if .System }}{{ .System }} {{ end }}{{ .Prompt }} [/INST]'
QWEN25 = '{{- if .Messages }}\n{{- if or .System .Tools }}<|im_start|>system\n{{- if .System }}\n{{ .System }}\n{{- end }}\n{{- if .Tools }}\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{{- range .Tools }}\n{"type": "function", "function": {{ .Function }}}\n{{- end }}\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>\n{{- end }}<|im_end|>\n{{ end }}\n{{- range $i, $_ := .Messages }}\n{{- $last := eq (len (slice $.Messages $i)) 1 -}}\n{{- if eq .Role "user" }}<|im_start|>user\n{{ .Content }}<|im_end|>\n{{ else if eq .Role "assistant" }}<|im_start|>assistant\n{{ if .Content }}{{ .Content }}\n{{- else if .ToolCalls }}<tool_call>\n{{ range .ToolCalls }}{"name": "{{ .Function.Name }}", "arguments": {{ .Function.Arguments }}}\n{{ end }}</tool_call>\n{{- end }}{{ if not $last }}<|im_end|>\n{{ end }}\n{{- else if eq .Role "tool" }}<|im_start|>user\n<tool_response>\n{{ .Content }}\n</tool_response><|im_end|>\n{{ end }}\n{{- if and (ne .Role "assistant") $last }}<|im_start|>assistant\n{{ end }}\n{{- end }}\n{{- else }}\n{{- if .System }}<|im_start|>system\n{{ .System }}<|im_end|>\n{{ end }}{{ if .Prompt }}<|im_start|>user\n{{ .Prompt }}<|im_end|>\n{{ end }}<|im_start|>assistant\n{{ end }}{{ .Response }}{{ if .Response }}<|im_end|>{{ end }}'

CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "2+2?"}]


def render(go: str, messages: list[dict], **kw) -> str:
    return render_chat(to_jinja(go), messages, **kw)


def test_a_messages_template_renders_as_ollama() -> None:
    """ChatML over .Messages: the system message is in .System and in .Messages (Ollama keeps it
    in both), the template's last newline kept (Jinja alone would drop it)."""
    assert render(CHATML, CHAT) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n"
        "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n")


def test_trim_markers_eat_the_whitespace_beside_them() -> None:
    assert render(LLAMA3, CHAT[1:]) == (
        "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|><|start_header_id|>assistant<|end_header_id|>"
        "\n\nHello!<|eot_id|><|start_header_id|>user<|end_header_id|>\n\n2+2?<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n")


def test_consecutive_messages_of_one_role_are_merged() -> None:
    merged = render(LLAMA3, [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}])
    assert merged.startswith("<|start_header_id|>user<|end_header_id|>\n\na\n\nb<|eot_id|>")


def test_a_legacy_template_runs_once_an_exchange_and_stops_at_the_reply() -> None:
    assert render(LEGACY, CHAT) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n")
    # a template without .Response: each exchange's prompt only, the system one with the first
    assert render(MISTRAL, CHAT) == "[INST] Be brief. Hi [/INST][INST] 2+2? [/INST]"


def test_ollamas_qwen2_5_template_with_tools_calls_and_results() -> None:
    tools = [{"type": "function", "function": {"name": "get", "description": "d", "parameters": {"type": "object"}}}]
    chat = [{"role": "user", "content": "w?"},
            {"role": "assistant", "content": "",
             "tool_calls": [{"type": "function", "function": {"name": "get", "arguments": {"city": "P"}}}]},
            {"role": "tool", "content": "sunny"}]
    assert render(QWEN25, chat, tools=tools) == (
        "<|im_start|>system\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
        '{"type": "function", "function": {"name":"get","description":"d","parameters":{"type":"object"}}}\n'
        "</tools>\n\nFor each function call, return a json object with function name and arguments within "
        "<tool_call></tool_call> XML tags:\n<tool_call>\n"
        '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\nw?<|im_end|>\n<|im_start|>assistant\n<tool_call>\n"
        '{"name": "get", "arguments": {"city":"P"}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\nsunny\n</tool_response><|im_end|>\n<|im_start|>assistant\n")
    # $last: no end-of-turn after the final assistant message, whose reply goes on
    assert render(QWEN25, CHAT[:3]).endswith("<|im_start|>assistant\nHello!")


def test_variables_with_else_range_else_and_literals() -> None:
    go = ('{{ $n := len .Messages }}{{ range $i, $m := .Messages }}{{ $i }}:{{ $m.Role }}'
          '{{ if eq $m.Role "user" `tool` }}!{{ else if ne $i 0 }}?{{ else }}-{{ end }} {{ else }}none{{ end }}'
          '{{ with .System }}[{{ . }}]{{ end }}{{ $n }} {{ len (slice .Messages 1 3) }}')
    assert render(go, CHAT) == "0:system- 1:user! 2:assistant? 3:user! [Be brief.]4 2"


def test_dot_in_an_else_of_range_or_with_is_the_outer_one() -> None:
    go = ("{{ if .Messages }}{{ with .Tools }}{{ . }}{{ else }}[{{ .System }}]{{ end }}"
          "{{ range .Tools }}x{{ else }}({{ .System }}){{ end }}{{ end }}")
    assert render(go, CHAT) == "[Be brief.](Be brief.)"


def test_text_that_looks_like_jinja_is_text() -> None:
    text = "{% raw %} {# '\\ %}{% endraw %}"  # Jinja's openers, a quote and a backslash: only text in Go
    assert render("{{ range .Messages }}" + text + "{{ .Content }}{{ end }}", CHAT[1:2]) == text + "Hi"


@pytest.mark.parametrize(("go", "message"), [
    ('{{ printf "%s" .Prompt }}', "the function `printf`"),
    ("{{ .Prompt | len }}", "a pipeline (`|`) has no translation here"),
    ("{{ $x := 1 }}{{ $x = 2 }}", "reassigning $x (`=`)"),
    ("{{ range .Messages }}", "a `{{ range }}` without its `{{ end }}`"),
    ("{{ end }}", "an `{{ end }}` without its block"),
    ("{{ .Context }}", ".Context is not a value Ollama gives a template"),
    ('{{ template "x" }}', "`{{ template }}` has no translation here"),
    ("{{ . }}", "the whole of `.` or `$` at the top"),
])
def test_what_cannot_be_translated_is_named(go: str, message: str) -> None:
    with pytest.raises(GoTemplateError, match=None) as e:
        to_jinja(go)
    assert message in str(e.value)


def test_which_templates_are_go() -> None:
    assert all(looks_like_go(t) for t in (CHATML, LLAMA3, LEGACY, MISTRAL, QWEN25, "{{/* c */}}x", "{{ end }}"))
    assert not any(looks_like_go(t) for t in ("{{ message.content }}", "{% for m in messages %}{{ m.role }}{% endfor %}",
                                              "{{ endpoint }}", "{{ messages[0].content | trim }}"))


def test_a_modelfile_with_an_ollama_template_gets_its_translation() -> None:
    text = 'FROM hf://a/b\nFAMILY qwen3_moe\nTEMPLATE """' + CHATML + '"""\n'
    recipe = parse_modelfile(text, name="x").recipe()
    assert recipe.template == to_jinja(CHATML) and "translated from an Ollama Go template" in recipe.template
    assert render_chat(recipe.template, CHAT[1:2]) == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
