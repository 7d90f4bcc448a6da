"""How a request becomes its prompt's tokens: the recipe's SYSTEM prompt, the chat template's
switches (a new turn or the last assistant message continued, thinking), a raw prompt, and the
opening of a forced tool call at the end (forced_calls.py). Pure request shaping; the model
manager (backend.py) runs it on a worker thread and decides the context.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from runtime.loading.registered import RegisteredModel
from runtime.text.chat_template import ChatTemplateError
from runtime.text.tokenizer import Tokenizer

from .forced_calls import UnsupportedToolChoice, forced_name, forced_opening
from .protocol import BadRequest, ChatRequest, GenerateRequest

Encode = Callable[[Tokenizer], list[int]]


@dataclass(frozen=True)
class PromptRecipe:
    """What a generation renders: `encode` (the template applied, off the event loop), the
    request's tools, whether a tool call is forced and of which function, and whether the reply
    continues the prompt's last words (a raw prompt, a prefilled reply) rather than a turn of its own."""

    encode: Encode
    tools: list[dict[str, Any]] | None = None
    forced: tuple[bool, str | None] = (False, None)
    continues_text: bool = False


def chat_recipe(registered: RegisteredModel, request: ChatRequest) -> PromptRecipe:
    """A chat request's prompt: the recipe's system prompt first, unless the conversation has one."""
    messages = with_system(registered, request.messages)
    tools = list(request.tools) if request.tools else None
    template_vars = chat_template_vars(request, messages)

    def encode(tokenizer: Tokenizer) -> list[int]:
        return tokenizer.encode_chat(messages, tools, **template_vars)

    return PromptRecipe(encode, tools, forced_name(request.tool_choice),
                        continues_text=template_vars.get("continue_final_message", False))


def generate_recipe(registered: RegisteredModel, request: GenerateRequest) -> PromptRecipe:
    """A completion's prompt: raw as given, or one user turn under the template."""
    if not isinstance(request.prompt, str):
        raise BadRequest("prompt must be a string")
    if request.suffix:
        raise BadRequest("suffix (fill-in-the-middle) is not supported: ft's chat templates have no FIM format")
    template_vars = {} if request.think is None else {"enable_thinking": bool(request.think)}
    system = request.system if request.system is not None else registered.config.get("system")

    def encode(tokenizer: Tokenizer) -> list[int]:
        if request.raw:
            return tokenizer.encode(request.prompt, add_special_tokens=True)
        messages = ([{"role": "system", "content": system}] if system else []) + [
            {"role": "user", "content": request.prompt}]
        return tokenizer.encode_chat(messages, add_generation_prompt=True, **template_vars)

    return PromptRecipe(encode, continues_text=request.raw)


def prompt_tokens(recipe: PromptRecipe, tokenizer: Tokenizer, family: str | None) -> tuple[list[int], str, int]:
    """The prompt's tokens, and the opening of a forced tool call that ends them with its tokens'
    count ("", 0 where none is forced). BadRequest where the template or the tool choice fails."""
    try:
        prompt = recipe.encode(tokenizer)
        forced, name = recipe.forced
        opening = forced_opening(family, tokenizer, recipe.tools, name, prompt) if forced else ""
        opened = tokenizer.encode(opening, add_special_tokens=False) if opening else []
    except UnsupportedToolChoice as e:
        raise BadRequest(f"tool_choice: {e}") from None
    except (ChatTemplateError, TypeError, ValueError) as e:
        raise BadRequest(f"cannot render the prompt: {e}") from None
    prompt = prompt + opened
    if not prompt:
        raise BadRequest("the prompt is empty: give some text")
    return prompt, opening, len(opened)


def count_chat_tokens(registered: RegisteredModel, request: ChatRequest, tokenizer: Tokenizer) -> int:
    """Prompt tokens a chat request takes (its template applied; no forced opening)."""
    messages = with_system(registered, request.messages)
    tools = list(request.tools) if request.tools else None
    try:
        return len(tokenizer.encode_chat(messages, tools, **chat_template_vars(request, messages)))
    except (ChatTemplateError, TypeError, ValueError) as e:
        raise BadRequest(f"cannot render the chat template: {e}") from None


def chat_template_vars(request: ChatRequest, messages: list[dict[str, Any]]) -> dict[str, Any]:
    """How the conversation is rendered: a new assistant turn, or (`continue_final`, where the
    last message is the assistant's own text) that message left open for the reply to continue;
    and the request's thinking switch."""
    last = messages[-1] if messages else {}
    prefill = (request.continue_final and last.get("role") == "assistant" and not last.get("tool_calls")
               and isinstance(last.get("content"), str) and last["content"] != "")
    as_turn = {"add_generation_prompt": False, "continue_final_message": True} if prefill \
        else {"add_generation_prompt": True}
    return as_turn | ({} if request.think is None else {"enable_thinking": bool(request.think)})


def with_system(registered: RegisteredModel, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The recipe's SYSTEM prompt first, unless the conversation brings its own; then the recipe's
    MESSAGEs (a REPL's /save keeps its chat so), before the conversation's, as Ollama puts them."""
    if not isinstance(messages, list) or not all(isinstance(m, Mapping) for m in messages):
        raise BadRequest("messages must be a list of message objects")
    stored = [m for m in registered.config.get("messages") or () if isinstance(m, Mapping)]
    system = registered.config.get("system")
    if system and not any(m.get("role") == "system" for m in [*stored, *messages]):
        return [{"role": "system", "content": system}, *stored, *messages]
    return [*stored, *messages]
