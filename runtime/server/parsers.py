"""Turn a model's raw generated text into TextDelta / ReasoningDelta / ToolCallEvent, as it streams.

Each model family writes reasoning and tool calls in its own syntax (the one its chat template
renders for past turns). A `Syntax` names the tags: an optional reasoning pair (`<think>` ...
`</think>`) and an optional tool-call section (a start tag, an end tag, and a function that turns
the text between them into calls). One engine, `TaggedParser`, runs every syntax:

- text arrives in arbitrary pieces; a piece that ends with what could still become a tag is held
  back until it either completes the tag or cannot, so no partial tag ever leaks out as text;
- reasoning opens only at the very start of the output (or is already open: `starts_in_reasoning`,
  for templates whose generation prompt ends with `<think>`), and runs to the closing tag or to the
  end of the output;
- whitespace that only separates structure (after `<think>`, before `</think>`, around tool calls)
  is dropped, as the templates add it when they render a turn back;
- a tool-call section ends at the first end tag at which its body parses; a body that never
  parses (malformed JSON, truncated output) comes back as text, never as an exception.

Families map to syntaxes in `FORMATS` (module names, imported lazily); unknown families get
`PlainParser`, which passes text through untouched.
"""

from __future__ import annotations

import importlib
import secrets
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .protocol import Event, ReasoningDelta, TextDelta, ToolCallEvent

ParsedCall = tuple[str, dict[str, Any]]  # (function name, arguments)
Schemas = Mapping[str, Mapping[str, Any]]  # function name -> JSON schema of its parameters
BodyParser = Callable[[str, Schemas], list[ParsedCall]]  # raises ValueError on a malformed body


@dataclass(frozen=True)
class Syntax:
    """The tags one family writes. `tool_end` None: the section runs to the end of the output."""

    reasoning: tuple[str, str] | None
    tool_start: str | None
    tool_end: str | None
    parse_tools: BodyParser | None


class OutputParser(ABC):
    """Incremental parser of one generation's text. Feed every piece, then call `finish` once."""

    @abstractmethod
    def feed(self, text: str) -> list[Event]:
        """Events for `text`, the next piece of output; text that may start a tag is held back."""

    @abstractmethod
    def finish(self, truncated: bool = False) -> list[Event]:
        """Events for whatever was held back, once the output has ended. `truncated`: it ended at
        max_tokens or the context's end, so a tool call still open was cut off, and is text."""


class PlainParser(OutputParser):
    """Text only: what the model wrote, byte for byte."""

    def feed(self, text: str) -> list[Event]:
        return [TextDelta(text)] if text else []

    def finish(self, truncated: bool = False) -> list[Event]:
        return []


def new_tool_call_id() -> str:
    return "call_" + secrets.token_hex(12)


def tool_schemas(tools: bool | Sequence[Mapping[str, Any]] | None) -> dict[str, Mapping[str, Any]]:
    """Function name -> parameters schema, from OpenAI-style tool definitions (or {} for a bool)."""
    schemas: dict[str, Mapping[str, Any]] = {}
    if isinstance(tools, (bool, type(None))):
        return schemas
    for tool in tools:
        function = tool.get("function", tool) if isinstance(tool, Mapping) else None
        if isinstance(function, Mapping) and isinstance(function.get("name"), str):
            parameters = function.get("parameters")
            schemas[function["name"]] = parameters if isinstance(parameters, Mapping) else {}
    return schemas


_TEXT, _REASONING, _TOOL = "text", "reasoning", "tool"


class TaggedParser(OutputParser):
    """The streaming engine behind every family's syntax (see the module docstring)."""

    def __init__(self, syntax: Syntax, tools: bool | Sequence[Mapping[str, Any]] | None = False,
                 starts_in_reasoning: bool = False) -> None:
        self.syntax = syntax
        self.schemas = tool_schemas(tools)
        self.tools_on = bool(tools) and syntax.tool_start is not None and syntax.parse_tools is not None
        in_reasoning = starts_in_reasoning and syntax.reasoning is not None
        self.mode = _REASONING if in_reasoning else _TEXT
        self.can_open_reasoning = syntax.reasoning is not None and not in_reasoning
        self.buf = ""  # unprocessed input
        self.body = ""  # tool-call section text after its start tag
        self.searched = 0  # body offsets already searched for the end tag
        self.strip_leading = in_reasoning  # drop whitespace that opens the current run
        self.pending_ws = ""  # trailing whitespace of the current run, held until we know what follows
        self.ws_before_tool = ""  # whitespace dropped before a tool section, restored if it is not one
        self.leading_ws = ""  # whitespace that opened the current run (dropped, unless it separates text)
        self.text_around_call = False  # text, then a tool call: text after it keeps its separating whitespace
        self.wrote_text = False
        self.out: list[Event] = []

    # -- public interface --

    def feed(self, text: str) -> list[Event]:
        self.buf += text
        while self._step():
            pass
        return self._take()

    def finish(self, truncated: bool = False) -> list[Event]:
        while True:
            while self._step():
                pass
            if self.mode != _TOOL:
                break
            self._resolve_unterminated_tool(truncated)
        if self.mode == _TEXT:
            self._run(self.buf, hold_ws=False)
            self._emit(TextDelta, self.pending_ws)
        elif self.mode == _REASONING:
            self._run(self.buf, hold_ws=True)  # trailing whitespace of reasoning is dropped
        self.buf = self.pending_ws = ""
        return self._take()

    # -- the state machine --

    def _text_tags(self) -> list[str]:
        tags = []
        if self.can_open_reasoning:
            tags.append(self.syntax.reasoning[0])  # type: ignore[index]
        if self.tools_on:
            tags.append(self.syntax.tool_start)  # type: ignore[arg-type]
        return tags

    def _step(self) -> bool:
        """Process buffered input; True when the mode changed and there may be more to do."""
        if self.mode == _TOOL:
            return self._scan_tool()
        if self.mode == _REASONING:
            close = self.syntax.reasoning[1]  # type: ignore[index]
            at = self.buf.find(close)
            if at < 0:
                keep = _partial_tag_len(self.buf, [close])
                self._run(self.buf[: len(self.buf) - keep], hold_ws=True)
                self.buf = self.buf[len(self.buf) - keep :]
                return False
            self._run(self.buf[:at], hold_ws=True)
            self.buf = self.buf[at + len(close) :]
            self._enter(_TEXT)
            return True
        tags = self._text_tags()
        found = min(((at, tag) for tag in tags if (at := self.buf.find(tag)) >= 0), default=None)
        if found is None:
            keep = _partial_tag_len(self.buf, tags)
            self._run(self.buf[: len(self.buf) - keep], hold_ws=bool(tags))
            self.buf = self.buf[len(self.buf) - keep :]
            return False
        at, tag = found
        if tag != self.syntax.tool_start and self.buf[:at].strip():
            self.can_open_reasoning = False  # text came first: this <think> is just text
            return True
        self._run(self.buf[:at], hold_ws=True)
        self.buf = self.buf[at + len(tag) :]
        if tag == self.syntax.tool_start:
            self.ws_before_tool = self.pending_ws
            self.body, self.searched = "", 0
            self._enter(_TOOL)
        else:
            self._enter(_REASONING)
        return True

    def _enter(self, mode: str) -> None:
        self.mode = mode
        self.pending_ws = self.leading_ws = ""
        self.strip_leading = True
        self.can_open_reasoning = False  # reasoning comes first or not at all

    def _scan_tool(self) -> bool:
        self.body += self.buf
        self.buf = ""
        end = self.syntax.tool_end
        if end is None:
            return False  # runs to the end of the output: parsed in finish()
        while (at := self.body.find(end, self.searched)) >= 0:
            self.searched = at + 1
            calls = self._parse(self.body[:at])
            if calls is not None:
                self._emit_calls(calls)
                self.buf = self.body[at + len(end) :]
                self.body = ""
                self._enter(_TEXT)
                return True
            inner = self.body.rfind(self.syntax.tool_start, 0, at)  # type: ignore[arg-type]
            if inner >= 0:  # the section's start tag was text ("I emit <tool_call> blocks."): restart at this one
                self._stray_start(inner)
                return True
        self.searched = max(self.searched, len(self.body) - len(end) + 1)
        return False

    def _stray_start(self, inner: int) -> None:
        """The open section's start tag, and its body up to the start tag at `inner`, are text; a
        section opens at that one."""
        start = self.syntax.tool_start
        assert start is not None
        self.mode, self.strip_leading = _TEXT, False
        text = self.pending_ws + self.ws_before_tool + start + self.body[:inner]
        core = text.rstrip()  # whitespace before a tool section is dropped, as anywhere
        self._emit(TextDelta, core)
        body = self.body[inner + len(start):]
        self._enter(_TOOL)
        self.ws_before_tool, self.body, self.searched = text[len(core):], body, 0

    def _resolve_unterminated_tool(self, truncated: bool) -> None:
        """At the end of the output inside a tool section: its calls, or its text if it has none,
        or if it was cut off before its end tag (a call missing its last arguments must not run)."""
        body, end = self.body + self.buf, self.syntax.tool_end
        self.body = self.buf = ""
        calls = None if truncated and end is not None else self._parse(body)
        if calls is not None:
            self._emit_calls(calls)
            self._enter(_TEXT)
            return
        # Not a tool call after all: the start tag and the body up to its first end tag are text,
        # and what follows goes through the parser again.
        at = body.find(end) if end else -1
        cut = at + len(end) if end and at >= 0 else len(body)
        self.mode = _TEXT
        self.strip_leading = False
        self._emit(TextDelta, self.ws_before_tool + self.syntax.tool_start + body[:cut])  # type: ignore[operator]
        self.buf = body[cut:]

    def _parse(self, body: str) -> list[ParsedCall] | None:
        try:
            calls = self.syntax.parse_tools(body, self.schemas)  # type: ignore[misc]
        except (ValueError, TypeError, KeyError, AttributeError):
            return None
        return calls or None

    # -- output --

    def _run(self, text: str, hold_ws: bool) -> None:
        """Append `text` to the current text or reasoning run, holding trailing whitespace if asked."""
        if self.strip_leading:
            stripped = text.lstrip()
            self.leading_ws += text[: len(text) - len(stripped)]
            text = stripped
            if not text:
                return
            self.strip_leading = False
            if self.mode == _TEXT and self.text_around_call:  # "Let me look.\n<call>\nDone." stays two lines
                text = self.leading_ws + text
            self.leading_ws = ""
        if not text:
            return
        kind = ReasoningDelta if self.mode == _REASONING else TextDelta
        core = text.rstrip() if hold_ws else text
        if not core:
            self.pending_ws += text
            return
        if kind is TextDelta:
            self.can_open_reasoning = False
        self._emit(kind, self.pending_ws + core)
        self.pending_ws = text[len(core) :]

    def _emit(self, kind: type[TextDelta] | type[ReasoningDelta], text: str) -> None:
        if not text:
            return
        self.wrote_text = self.wrote_text or kind is TextDelta
        if self.out and type(self.out[-1]) is kind:
            self.out[-1] = kind(self.out[-1].text + text)  # type: ignore[union-attr]
        else:
            self.out.append(kind(text))

    def _emit_calls(self, calls: list[ParsedCall]) -> None:
        self.text_around_call = self.text_around_call or self.wrote_text
        self.out.extend(ToolCallEvent(new_tool_call_id(), name, arguments) for name, arguments in calls)

    def _take(self) -> list[Event]:
        out, self.out = self.out, []
        return out


def _partial_tag_len(text: str, tags: Sequence[str]) -> int:
    """Length of the longest end of `text` that is a proper prefix of one of `tags`."""
    for size in range(min(len(text), max((len(t) for t in tags), default=1) - 1), 0, -1):
        tail = text[-size:]
        if any(t.startswith(tail) for t in tags):
            return size
    return 0


# family (Hugging Face model_type / FTW family) -> module in this package defining SYNTAX
FORMATS: dict[str, str] = {
    "qwen3_moe": "parsers_tool_call",  # Qwen3 MoE and the built-in tiny model: <tool_call> JSON
    "qwen3": "parsers_tool_call",
    "qwen3_next": "parsers_tool_call",
    "qwen3_5_moe": "parsers_tool_call",  # Qwen3.5: <tool_call><function=...> XML
    "qwen3_5": "parsers_tool_call",
    "tiny": "parsers_tool_call",
    "glm4_moe": "parsers_glm",  # GLM-4.5: <tool_call>NAME<arg_key>..., same tag
    "glm_moe_dsa": "parsers_glm",  # GLM-5
    "deepseek_v3": "parsers_deepseek",  # DeepSeek-V3/R1/V3.1
    "deepseek_v2": "parsers_deepseek",
    "mixtral": "parsers_mistral",
    "mistral": "parsers_mistral",
}


def syntax_for(family: str | None) -> Syntax | None:
    """The syntax a family writes, or None for plain text."""
    module_name = FORMATS.get(family or "")
    if module_name is None:
        return None
    return importlib.import_module(f"{__package__}.{module_name}").SYNTAX


def make_parser(family: str | None, tools: bool | Sequence[Mapping[str, Any]] | None = False, *,
                starts_in_reasoning: bool = False) -> OutputParser:
    """A fresh parser for one generation by a model of `family`.

    `tools`: whether tool calls are parsed (when False, tool-call tags stay text). Passing the
    request's tool definitions instead of True also types the arguments of XML-style calls by
    their schemas (a "string" parameter stays a string). `starts_in_reasoning`: the prompt
    already opened the reasoning block (see `opens_reasoning`).
    """
    syntax = syntax_for(family)
    if syntax is None:
        return PlainParser()
    return TaggedParser(syntax, tools, starts_in_reasoning)


def opens_reasoning(family: str | None, prompt: str) -> bool:
    """Whether the rendered `prompt` ends inside an open reasoning block (Qwen3.5, GLM-5 and
    DeepSeek-V3.1 thinking prompts end with `<think>`), so the output starts as reasoning."""
    syntax = syntax_for(family)
    return bool(syntax and syntax.reasoning and prompt.rstrip().endswith(syntax.reasoning[0]))
