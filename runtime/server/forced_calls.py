"""tool_choice "required" or a named function: the reply starts as a tool call.

OpenAI's and Anthropic's APIs guarantee a call when the request forces one (vLLM does it with
guided decoding). ft writes the opening of the call itself, in the family's syntax, after the
generation prompt: the model continues from inside the call, so the reply is a call (of the named
function, where one is named) unless it is cut off. The opening is part of the prompt, and the
reply's parser is fed it first (`runtime/server/runner.py`), so the call comes out as any other.

The opening depends on the syntax the model was trained to write (`parsers.py`):

- `<tool_call>` with a JSON body (Qwen3, the tiny model): `<tool_call>\\n{"name": "NAME", "arguments": `;
- `<tool_call>` with an XML body (Qwen3.5, Qwen3-Coder: a chat template that writes `<function=`):
  `<tool_call>\\n<function=NAME>\\n`;
- GLM's bare name: `<tool_call>NAME`;
- DeepSeek's and Mistral's sections: their start tags, for "required" only. Their call bodies
  come in two versions told apart by the tokenizer, not the family, so a named function is refused
  for them rather than guessed.

Forcing a call skips the reasoning a thinking model would write first, as guided decoding does.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from ..text.tokenizer import Tokenizer
from .parsers import opens_reasoning, syntax_for
from .parsers_deepseek import CALL_BEGIN, CALLS_BEGIN
from .parsers_glm import SYNTAX as GLM_SYNTAX
from .parsers_mistral import TOOL_CALLS


class UnsupportedToolChoice(ValueError):
    """The family has no tool-call syntax ft can open, or none that names the function."""


def forced_name(tool_choice: object) -> tuple[bool, str | None]:
    """Whether `tool_choice` (as ChatRequest holds it) forces a call, and the function it names."""
    if tool_choice == "required":
        return True, None
    if isinstance(tool_choice, dict):
        function = tool_choice.get("function")
        if isinstance(function, dict) and isinstance(function.get("name"), str):
            return True, function["name"]
    return False, None


def call_opening(family: str | None, chat_template: str, name: str | None) -> str:
    """The text that starts the reply as a tool call, of `name` (None: of the model's choice)."""
    syntax = syntax_for(family)
    if syntax is None or syntax.tool_start is None:
        raise UnsupportedToolChoice(f"models of family {family or 'unknown'} have no tool-call syntax ft knows, "
                                    "so a call cannot be forced: use tool_choice auto")
    if syntax is GLM_SYNTAX:
        return syntax.tool_start + (name or "")
    if syntax.tool_start == "<tool_call>":
        if name is None:
            return "<tool_call>\n"
        if "<function=" in chat_template:
            return f"<tool_call>\n<function={name}>\n"
        return '<tool_call>\n{"name": ' + json.dumps(name, ensure_ascii=False) + ', "arguments": '
    if name is not None:
        raise UnsupportedToolChoice(f"a named function cannot be forced for models of family {family}: their "
                                    "call syntax depends on the tokenizer's version; use tool_choice required")
    if syntax.tool_start == CALLS_BEGIN:
        return CALLS_BEGIN + CALL_BEGIN
    if syntax.tool_start == TOOL_CALLS:
        return TOOL_CALLS
    raise UnsupportedToolChoice(f"a call cannot be forced for models of family {family}")


def forced_opening(family: str | None, tokenizer: Tokenizer, tools: Sequence[Any] | None, name: str | None,
                   prompt: Sequence[int]) -> str:
    """`call_opening` for a rendered `prompt`: where its template opened a thinking block
    (Qwen3.5, GLM-5 and DeepSeek-V3.1 prompts end with `<think>`), the block is closed first."""
    opening = call_opening(family, tokenizer.select_chat_template(tools), name)
    syntax = syntax_for(family)
    if syntax is not None and syntax.reasoning and opens_reasoning(family, tokenizer.decode(list(prompt[-8:]))):
        opening = syntax.reasoning[1] + "\n\n" + opening
    return opening
