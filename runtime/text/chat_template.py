"""Render Hugging Face chat templates the way transformers' `apply_chat_template` does.

A chat template is Jinja text shipped with a model (tokenizer_config.json, chat_template.jinja, a
Modelfile TEMPLATE). It is untrusted input, so it runs in Jinja's immutable sandbox, with the
environment transformers builds in `transformers/utils/chat_template_utils.py`: `trim_blocks` and
`lstrip_blocks`, the `loopcontrols` extension, a `{% generation %}` block that renders its body,
`raise_exception`, `strftime_now`, a `tojson` filter that keeps non-ASCII text and does not
HTML-escape, and `dict`/`namespace` that refuse underscore names. The inputs are prepared the same
way too: message keys whose value is None are dropped, everything is rebuilt out of plain JSON
types, and a message's reasoning is copied under `reasoning_content` and `thinking`.

On top of that, `*` and `**` refuse results that would eat the machine (`'a' * 10**12`) and the
output is capped: those only ever fire on templates no model ships.
"""

from __future__ import annotations

import dataclasses
import json
import operator
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from functools import lru_cache
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.parser
import jinja2.utils
from jinja2.exceptions import SecurityError, TemplateError, TemplateSyntaxError
from jinja2.sandbox import ImmutableSandboxedEnvironment

MAX_OUTPUT_CHARS = 64 * 1024 * 1024  # a rendered prompt longer than any context window
MAX_SEQUENCE_PRODUCT = 16 * 1024 * 1024  # longest str/list a template may build with `*`
MAX_INT_BITS = 4096  # largest integer a template may build with `**`

# Names transformers copies a message's reasoning under; templates read `reasoning_content`
# (Qwen, GLM, DeepSeek) or `thinking` (gpt-oss).
_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")
_CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "


class ChatTemplateError(ValueError):
    """A chat template that cannot be compiled or rendered, or inputs it cannot take."""


class _RaisedByTemplate(TemplateError):
    """What `raise_exception(...)` throws: the template's own message, kept apart from Jinja's."""


class _GenerationBlock(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}` marks assistant text for training masks; rendering
    only needs its body."""

    tags = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render_body"), [], [], body).set_lineno(lineno)

    def _render_body(self, caller: Any) -> str:
        return caller()


def _raise_exception(message: object) -> None:
    raise _RaisedByTemplate(str(message))


def _tojson(x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None,
            sort_keys: bool = False) -> str:
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


class _TemplateDict:
    """`dict(...)` in a template, without exposing the `dict` type itself."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict:
        return dict.fromkeys(*args, **kwargs)


def _check_namespace_name(name: object) -> None:
    if isinstance(name, str) and name.startswith("_"):
        raise SecurityError(f"chat templates cannot store underscore-prefixed attributes on a namespace ({name!r})")


class _TemplateNamespace(jinja2.utils.Namespace):
    """`namespace(...)` that refuses underscore names, which could reach Python internals."""

    def __init__(*args: Any, **kwargs: Any) -> None:  # Jinja's signature trick: `self` may be a key
        self, rest = args[0], args[1:]
        attrs = dict(*rest, **kwargs)
        for name in attrs:
            _check_namespace_name(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _check_namespace_name(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)


def _sized(x: Any) -> bool:
    return isinstance(x, (str, list, tuple))


class _ChatEnvironment(ImmutableSandboxedEnvironment):
    """The sandbox with a size check on `*` and `**` (intercepted ops are never constant-folded)."""

    intercepted_binops = frozenset(["*", "**"])

    def call_binop(self, context: Any, operator_: str, left: Any, right: Any) -> Any:
        if operator_ == "*":
            seq, count = (left, right) if _sized(left) else (right, left)
            if _sized(seq) and isinstance(count, int) and len(seq) * count > MAX_SEQUENCE_PRODUCT:
                raise SecurityError(f"`*` would build a sequence of {len(seq) * count} items")
            return operator.mul(left, right)
        if isinstance(left, int) and isinstance(right, int) and abs(left) > 1 and right > 0:
            if right * max(abs(left).bit_length(), 1) > MAX_INT_BITS:
                raise SecurityError(f"`**` would build an integer of about {right * abs(left).bit_length()} bits")
        return operator.pow(left, right)


def _make_environment() -> _ChatEnvironment:
    env = _ChatEnvironment(trim_blocks=True, lstrip_blocks=True,
                           extensions=[_GenerationBlock, jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["dict"] = _TemplateDict()
    env.globals["namespace"] = _TemplateNamespace
    return env


_ENVIRONMENT = _make_environment()


@lru_cache(maxsize=64)
def compile_template(template: str) -> jinja2.Template:
    """Compile `template` (cached); ChatTemplateError names the line of a syntax error."""
    if not isinstance(template, str):
        raise ChatTemplateError(f"a chat template must be a string, got {type(template).__name__}")
    try:
        return _ENVIRONMENT.from_string(template)
    except TemplateSyntaxError as e:
        raise ChatTemplateError(f"chat template syntax error on line {e.lineno}: {e.message}") from None
    except (TemplateError, RecursionError, MemoryError) as e:
        raise ChatTemplateError(f"chat template does not compile: {type(e).__name__}: {e}") from None


def plain_data(value: Any) -> Any:
    """`value` rebuilt out of str/int/float/bool/None, dicts, lists and tuples.

    Subclasses of the scalars are cut back to the base type (their extra methods could be unsafe
    in the sandbox); dataclasses become dicts; anything else becomes an inert "<TypeName>" string,
    as transformers does for media objects.
    """
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, Mapping):
        return {plain_data(k): plain_data(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain_data(v) for v in value]
    if isinstance(value, tuple):
        return tuple(plain_data(v) for v in value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain_data(getattr(value, f.name)) for f in dataclasses.fields(value)}
    return f"<{type(value).__name__}>"


def _prepare_messages(messages: Sequence[Any]) -> list[dict[str, Any]]:
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Iterable):
        raise ChatTemplateError(f"messages must be a list of dicts, got {type(messages).__name__}")
    prepared = []
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise ChatTemplateError(f"message {i} must be a dict, got {type(message).__name__}")
        # APIs send `content: null` / `tool_calls: null`; templates handle a missing key better.
        message = plain_data({k: v for k, v in message.items() if v is not None})
        reasoning = next((message[k] for k in _REASONING_FIELDS if message.get(k) is not None), None)
        if reasoning is not None:
            message = {"thinking": reasoning, **message, "reasoning_content": reasoning}
        prepared.append(message)
    if not prepared:
        raise ChatTemplateError("cannot apply a chat template to an empty conversation")
    return prepared


def _check_list_of_dicts(name: str, items: Any) -> None:
    if items is None:
        return
    if isinstance(items, (str, bytes, Mapping)) or not isinstance(items, Iterable):
        raise ChatTemplateError(f"{name} must be a list of JSON-schema dicts, got {type(items).__name__}")
    for i, item in enumerate(items):
        if not isinstance(item, Mapping):
            raise ChatTemplateError(f"{name}[{i}] must be a dict, got {type(item).__name__}")


def _mark_final_message(messages: list[dict[str, Any]], field: str, template: str) -> str:
    """Tag the text the model should continue; returns that text (transformers' continue logic)."""
    final = messages[-1].get(field)
    if final is None:
        raise ChatTemplateError(f'continue_final_message: the final message has no "{field}" to continue')
    fields = [field]
    if field in _REASONING_FIELDS:
        fields = [f for f in _REASONING_FIELDS if messages[-1].get(f) == final]
    if not any(f in template for f in fields):
        raise ChatTemplateError(f'continue_final_message: the chat template never reads "{field}"')
    if isinstance(final, (list, tuple)):
        for block in reversed(final):
            if isinstance(block, dict) and "text" in block:
                text = block["text"]
                block["text"] = text + _CONTINUE_TAG
                return text
        raise ChatTemplateError("continue_final_message: the final message has no text block to continue")
    for f in fields:
        messages[-1][f] = messages[-1][f] + _CONTINUE_TAG
    return str(final)


def _cut_at_tag(rendered: str, final_text: str) -> str:
    if final_text.strip() not in rendered or _CONTINUE_TAG.strip() not in rendered:
        raise ChatTemplateError("continue_final_message: the chat template drops part of the final message")
    at = rendered.rindex(_CONTINUE_TAG.strip())
    if rendered[at : at + len(_CONTINUE_TAG)] == _CONTINUE_TAG:
        return rendered[:at]
    return rendered[:at].rstrip()  # the template trimmed the message's trailing space


def render_chat(
    template: str,
    messages: Sequence[Mapping[str, Any]],
    *,
    tools: Sequence[Mapping[str, Any]] | None = None,
    documents: Sequence[Mapping[str, Any]] | None = None,
    add_generation_prompt: bool = True,
    continue_final_message: bool | str = False,
    special_tokens: Mapping[str, str] | None = None,
    **kwargs: Any,
) -> str:
    """Render `messages` with `template` exactly as transformers' `apply_chat_template(tokenize=False)`.

    `tools` are JSON schemas (OpenAI function format), `documents` dicts for RAG templates.
    `special_tokens` (bos_token, eos_token, ...) and `kwargs` (enable_thinking, ...) become template
    variables; `kwargs` win on a clash. `continue_final_message` (True, or the name of the field
    to continue) leaves the last message open for the model to go on with, instead of adding a
    generation prompt. Raises ChatTemplateError, with the template's own message when it calls
    `raise_exception`.
    """
    if continue_final_message and add_generation_prompt:
        raise ChatTemplateError("continue_final_message and add_generation_prompt cannot both be set")
    compiled = compile_template(template)
    _check_list_of_dicts("tools", tools)
    _check_list_of_dicts("documents", documents)
    chat = _prepare_messages(messages)
    final_text = None
    if continue_final_message:
        field = continue_final_message if isinstance(continue_final_message, str) else "content"
        final_text = _mark_final_message(chat, field, template)
    variables = plain_data({**(special_tokens or {}), **kwargs})
    variables.update(
        messages=chat,
        tools=plain_data(list(tools)) if tools is not None else None,
        documents=plain_data(list(documents)) if documents is not None else None,
        add_generation_prompt=add_generation_prompt,
    )
    rendered = _render(compiled, variables)
    return _cut_at_tag(rendered, final_text) if final_text is not None else rendered


def _render(compiled: jinja2.Template, variables: dict[str, Any]) -> str:
    parts: list[str] = []
    size = 0
    try:
        for part in compiled.generate(**variables):
            size += len(part)
            if size > MAX_OUTPUT_CHARS:
                raise ChatTemplateError(f"chat template output exceeds {MAX_OUTPUT_CHARS} characters")
            parts.append(part)
    except ChatTemplateError:
        raise
    except _RaisedByTemplate as e:
        raise ChatTemplateError(f"chat template refused the conversation: {e.message}") from None
    except SecurityError as e:
        raise ChatTemplateError(f"chat template attempted an unsafe operation: {e}") from None
    except TemplateError as e:
        raise ChatTemplateError(f"chat template failed: {type(e).__name__}: {e}") from None
    except RecursionError:
        raise ChatTemplateError("chat template recursed too deeply") from None
    except Exception as e:  # a template is arbitrary code: `'a' + none`, `x[5]` on a short list, ...
        raise ChatTemplateError(f"chat template failed: {type(e).__name__}: {e}") from None
    return "".join(parts)
