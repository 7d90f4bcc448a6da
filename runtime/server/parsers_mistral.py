"""Mixtral / Mistral: `[TOOL_CALLS]` followed by the calls, up to the end of the output.

- v3 tokenizers (Mixtral-8x22B, Mistral-7B-v0.3): `[TOOL_CALLS] [{"name": ..., "arguments": {...}}, ...]`
- v11+ tokenizers: `[TOOL_CALLS]NAME[ARGS]{...}`, repeated for each call

There is no reasoning block and no end tag: the model stops (EOS) after its calls.
"""

from __future__ import annotations

import json

from .parsers import ParsedCall, Schemas, Syntax
from .parsers_tool_call import json_call

TOOL_CALLS, ARGS = "[TOOL_CALLS]", "[ARGS]"


def parse_calls(body: str, schemas: Schemas) -> list[ParsedCall]:
    text = body.strip()
    if text.startswith(("[", "{")):
        value, end = json.JSONDecoder().raw_decode(text)
        if text[end:].strip():
            raise ValueError("text after the tool calls")
        items = value if isinstance(value, list) else [value]
        return [json_call(json.dumps(item)) for item in items]
    calls = []
    for part in text.split(TOOL_CALLS):
        name, sep, arguments = part.partition(ARGS)
        if not sep or not name.strip():
            raise ValueError("expected NAME[ARGS]{...}")
        value = json.loads(arguments)
        if not isinstance(value, dict):
            raise ValueError("tool-call arguments must be an object")
        calls.append((name.strip(), value))
    return calls


SYNTAX = Syntax(reasoning=None, tool_start=TOOL_CALLS, tool_end=None, parse_tools=parse_calls)
