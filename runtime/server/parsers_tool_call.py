"""`<tool_call>` ... `</tool_call>` with `<think>` reasoning: Qwen3, Qwen3.5, the tiny model (and,
through parsers_glm.py, GLM-4.5/5).

The body of one call comes in three shapes, told apart by how it starts:

- JSON (Qwen3, Hermes, the tiny model): `{"name": "f", "arguments": {"x": 1}}`
- XML (Qwen3.5, Qwen3-Coder): `<function=f>\n<parameter=x>\n1\n</parameter>\n</function>`
- GLM: `f\n<arg_key>x</arg_key>\n<arg_value>1</arg_value>` (GLM-5 without the newlines), GLM's
  families only: in a Qwen model's prose, "<tool_call>search</tool_call>" is no call of `search`

The XML and GLM templates write string values as they are and anything else as JSON, so a value
is a string when the tool's schema says so, otherwise JSON when it parses, otherwise a string.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from .parsers import ParsedCall, Schemas, Syntax

_FUNCTION = re.compile(r"<function=([^>\n]+)>(.*?)(?:</function>\s*)?\Z", re.DOTALL)
_PARAMETER = re.compile(r"\s*<parameter=([^>\n]+)>(.*?)</parameter>", re.DOTALL)
_GLM_ARG = re.compile(r"\s*<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>", re.DOTALL)
_NAME = re.compile(r"[^\s<>{}\"']+")


def parse_tool_call(body: str, schemas: Schemas) -> list[ParsedCall]:
    """A JSON or XML call (Qwen3, Qwen3.5)."""
    text = body.strip()
    if text.startswith("{"):
        return [json_call(text)]
    if text.startswith("<function="):
        return [_xml_call(text, schemas)]
    raise ValueError("a tool call is a JSON object or a <function=...> block")


def parse_glm_tool_call(body: str, schemas: Schemas) -> list[ParsedCall]:
    """A GLM call, or a JSON or XML one (GLM-4.5/5)."""
    text = body.strip()
    if text.startswith(("{", "<function=")):
        return parse_tool_call(text, schemas)
    return [_glm_call(text, schemas)]


def json_call(text: str) -> ParsedCall:
    """`{"name": ..., "arguments": {...}}` (or "parameters"; arguments may be a JSON string)."""
    call = json.loads(text)
    if not isinstance(call, dict) or not isinstance(call.get("name"), str) or not call["name"]:
        raise ValueError("a tool call needs a name")
    arguments = call.get("arguments", call.get("parameters", {}))
    if isinstance(arguments, str):
        arguments = json.loads(arguments) if arguments.strip() else {}
    if not isinstance(arguments, dict):
        raise ValueError("tool-call arguments must be an object")
    return call["name"], arguments


def _xml_call(text: str, schemas: Schemas) -> ParsedCall:
    match = _FUNCTION.match(text)
    if match is None:
        raise ValueError("not a <function=...> block")
    name = match.group(1).strip()
    pairs = _pairs(_PARAMETER, match.group(2))
    # the template writes each value between newlines: "<parameter=x>\n" value "\n</parameter>"
    return name, _typed(name, {k: _strip_one_newline(v) for k, v in pairs}, schemas)


def _glm_call(text: str, schemas: Schemas) -> ParsedCall:
    at = text.find("<arg_key>")
    name = (text if at < 0 else text[:at]).strip()
    if not _NAME.fullmatch(name):
        raise ValueError(f"not a function name: {name[:40]!r}")
    pairs = _pairs(_GLM_ARG, "" if at < 0 else text[at:])
    return name, _typed(name, dict(pairs), schemas)


def _pairs(pattern: re.Pattern[str], text: str) -> list[tuple[str, str]]:
    pairs, pos = [], 0
    while (match := pattern.match(text, pos)) is not None:
        pairs.append((match.group(1).strip(), match.group(2)))
        pos = match.end()
    if text[pos:].strip():
        raise ValueError(f"unexpected text in a tool call: {text[pos:pos + 40]!r}")
    return pairs


def _strip_one_newline(value: str) -> str:
    value = value[1:] if value.startswith("\n") else value
    return value[:-1] if value.endswith("\n") else value


def _typed(name: str, raw: Mapping[str, str], schemas: Schemas) -> dict[str, Any]:
    properties = (schemas.get(name) or {}).get("properties") or {}
    return {key: _value(value, properties.get(key)) for key, value in raw.items()}


def _value(text: str, schema: Any) -> Any:
    declared = schema.get("type") if isinstance(schema, Mapping) else None
    if declared == "string" or (isinstance(declared, list) and declared and set(declared) <= {"string", "null"}):
        return text
    try:
        return json.loads(text)
    except ValueError:
        return text


SYNTAX = Syntax(reasoning=("<think>", "</think>"), tool_start="<tool_call>", tool_end="</tool_call>",
                parse_tools=parse_tool_call)
