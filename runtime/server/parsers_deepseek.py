"""DeepSeek-V3 / R1 / V3.1: `<think>` reasoning and the `<｜tool▁calls▁begin｜>` section.

Inside the section each call is `<｜tool▁call▁begin｜>` ... `<｜tool▁call▁end｜>`, written two ways:

- V3 / R1: `function<｜tool▁sep｜>NAME\\n```json\\n{...}\\n```` (the tool type first, then a fenced block)
- V3.1:    `NAME<｜tool▁sep｜>{...}`

The tags are special tokens: the backend must decode them (skip_special_tokens=False).
"""

from __future__ import annotations

import json
import re

from .parsers import ParsedCall, Schemas, Syntax


def _tag(words: str) -> str:
    return "<\uff5c" + words.replace(" ", "\u2581") + "\uff5c>"  # fullwidth bar, SentencePiece space


CALLS_BEGIN, CALLS_END = _tag("tool calls begin"), _tag("tool calls end")
CALL_BEGIN, CALL_END, SEP = _tag("tool call begin"), _tag("tool call end"), _tag("tool sep")

_CALL = re.compile(r"\s*" + re.escape(CALL_BEGIN) + r"(.*?)" + re.escape(CALL_END), re.DOTALL)
_FENCED = re.compile(r"([^\n]+)\n```(?:json)?\s*\n(.*?)\n?```\s*\Z", re.DOTALL)


def parse_calls(body: str, schemas: Schemas) -> list[ParsedCall]:
    calls, pos = [], 0
    while (match := _CALL.match(body, pos)) is not None:
        calls.append(_call(match.group(1)))
        pos = match.end()
    if body[pos:].strip():
        raise ValueError(f"unexpected text in a tool-call section: {body[pos:pos + 40]!r}")
    return calls


def _call(text: str) -> ParsedCall:
    head, sep, rest = text.partition(SEP)
    if not sep:
        raise ValueError("a tool call without a separator")
    fenced = _FENCED.match(rest)
    if fenced is not None:  # V3: head is the tool type ("function")
        name, arguments = fenced.group(1).strip(), json.loads(fenced.group(2))
    else:  # V3.1: head is the name
        name, arguments = head.strip(), json.loads(rest) if rest.strip() else {}
    if not name or not isinstance(arguments, dict):
        raise ValueError("a tool call needs a name and an object of arguments")
    return name, arguments


SYNTAX = Syntax(reasoning=("<think>", "</think>"), tool_start=CALLS_BEGIN, tool_end=CALLS_END,
                parse_tools=parse_calls)
