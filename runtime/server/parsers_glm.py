"""GLM-4.5/5: the `<tool_call>` tags of Qwen3 (parsers_tool_call.py), with GLM's bare-name body:
`f\n<arg_key>x</arg_key>\n<arg_value>1</arg_value>`."""

from __future__ import annotations

from .parsers import Syntax
from .parsers_tool_call import parse_glm_tool_call

SYNTAX = Syntax(reasoning=("<think>", "</think>"), tool_start="<tool_call>", tool_end="</tool_call>",
                parse_tools=parse_glm_tool_call)
