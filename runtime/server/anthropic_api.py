"""The Anthropic API flavour: /v1/messages (streaming or not) and /v1/messages/count_tokens.

Messages and content blocks become the protocol's ChatRequest in Hugging Face chat format: text
blocks join into one string, `tool_use` blocks become the assistant's `tool_calls`, each
`tool_result` block becomes a `tool` message, `thinking` blocks become `reasoning_content`; tools'
`input_schema` becomes an OpenAI-style function schema for the chat template. The backend's events
come back as a Message or as the exact event sequence the `anthropic` SDKs accumulate:
message_start, then per block content_block_start / content_block_delta (text_delta,
thinking_delta, input_json_delta) / content_block_stop, a ping after the first block opens,
message_delta (stop_reason, usage) and message_stop. Errors are {"type": "error", "error": {type,
message}}. API keys and the anthropic-version header are accepted and not checked.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import AsyncIterator, Mapping
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.concurrency import run_in_threadpool

from . import streaming
from .openai_api import (
    SSE_HEADERS,
    as_server_error,
    client_gone,
    events_after_start,
    guarded_route_class,
    read_json,
    sampling_options,
)
from .protocol import (
    Backend,
    BadRequest,
    ChatRequest,
    Done,
    Event,
    Message,
    ReasoningDelta,
    ServerError,
    Started,
    TextDelta,
    ToolCallEvent,
)

STOP_REASONS = {"stop": "end_turn", "stop_sequence": "stop_sequence", "length": "max_tokens",
                "context": "model_context_window_exceeded", "tool_calls": "tool_use"}
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 503: "overloaded_error"}


def error_body(error: ServerError) -> dict[str, Any]:
    return {"type": "error", "error": {"type": ERROR_TYPES.get(error.status, "api_error"), "message": error.message}}


# -- requests --


def _blocks(content: Any, field: str) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list) or not all(isinstance(b, dict) for b in content):
        raise BadRequest(f"{field} must be a string or an array of content blocks")
    return content


def _block_text(block: Mapping[str, Any], where: str) -> str:
    if not isinstance(block.get("text"), str):
        raise BadRequest(f"{where}: a text block needs a string `text`")
    return block["text"]


def _unsupported(block: Mapping[str, Any], where: str) -> BadRequest:
    kind = block.get("type")
    if kind in ("image", "document", "search_result"):
        return BadRequest(f"{where}: {kind} blocks are not supported; the models ft serves read text only")
    return BadRequest(f"{where}: unsupported content block type {kind!r}")


def _tool_result(block: Mapping[str, Any], where: str, names: Mapping[str, str]) -> Message:
    call_id = block.get("tool_use_id")
    if not isinstance(call_id, str):
        raise BadRequest(f"{where}: a tool_result block needs tool_use_id")
    content = block.get("content")
    texts = []
    for k, part in enumerate(_blocks("" if content is None else content, f"{where}.content")):
        if part.get("type") != "text":
            raise _unsupported(part, f"{where}.content[{k}]")
        texts.append(_block_text(part, f"{where}.content[{k}]"))
    text = "\n".join(texts)
    message: Message = {"role": "tool", "tool_call_id": call_id, "content": f"Error: {text}" if block.get("is_error") else text}
    if call_id in names:
        message["name"] = names[call_id]
    return message


def _assistant(blocks: list[dict[str, Any]], where: str, names: dict[str, str]) -> Message:
    texts, thinking, calls = [], [], []
    for j, block in enumerate(blocks):
        kind, at = block.get("type"), f"{where}.content[{j}]"
        if kind == "text":
            texts.append(_block_text(block, at))
        elif kind == "thinking":
            thinking.append(str(block.get("thinking") or ""))
        elif kind == "redacted_thinking":
            continue
        elif kind == "tool_use":
            if not isinstance(block.get("id"), str) or not isinstance(block.get("name"), str):
                raise BadRequest(f"{at}: a tool_use block needs id and name")
            arguments = block.get("input") or {}
            if not isinstance(arguments, dict):
                raise BadRequest(f"{at}.input must be an object")
            calls.append({"id": block["id"], "type": "function", "function": {"name": block["name"], "arguments": arguments}})
            names[block["id"]] = block["name"]
        else:
            raise _unsupported(block, at)
    message: Message = {"role": "assistant", "content": "\n".join(texts)}
    if any(thinking):
        message["reasoning_content"] = "\n".join(t for t in thinking if t)
    if calls:
        message["tool_calls"] = calls
    return message


def chat_messages(system: Any, raw: Any) -> list[Message]:
    """Anthropic system + messages -> Hugging Face chat format."""
    messages: list[Message] = []
    if system:
        texts = [_block_text(b, f"system[{i}]") for i, b in enumerate(_blocks(system, "system"))]
        messages.append({"role": "system", "content": "\n".join(texts)})
    if not isinstance(raw, list) or not raw:
        raise BadRequest("messages must be a non-empty array")
    names: dict[str, str] = {}  # tool_use id -> tool name, for templates that print it
    for i, message in enumerate(raw):
        where = f"messages[{i}]"
        role = message.get("role") if isinstance(message, dict) else None
        if role not in ("user", "assistant"):
            raise BadRequest(f"{where}.role must be user or assistant (got {role!r})")
        blocks = _blocks(message.get("content"), f"{where}.content")
        if not blocks and not (role == "assistant" and i == len(raw) - 1):  # as the Messages API refuses it
            raise BadRequest(f"{where}: all messages must have non-empty content except for the optional final "
                             "assistant message")
        if role == "assistant":
            messages.append(_assistant(blocks, where, names))
            continue
        texts = []
        for j, block in enumerate(blocks):
            if block.get("type") == "text":
                texts.append(_block_text(block, f"{where}.content[{j}]"))
            elif block.get("type") == "tool_result":
                messages.append(_tool_result(block, f"{where}.content[{j}]", names))
            else:
                raise _unsupported(block, f"{where}.content[{j}]")
        if texts or not blocks:
            messages.append({"role": "user", "content": "\n".join(texts)})
    return messages


def chat_tools(tools: Any, choice: Any) -> tuple[list[dict[str, Any]] | None, Any]:
    """Anthropic tools and tool_choice as ChatRequest takes them ({"type": "none"} drops the tools)."""
    if tools is not None and not isinstance(tools, list):
        raise BadRequest("tools must be an array")
    functions = []
    for i, tool in enumerate(tools or []):
        if not isinstance(tool, dict) or not isinstance(tool.get("name"), str):
            raise BadRequest(f"tools[{i}] must be {{name, description, input_schema}}")
        if tool.get("type") not in (None, "custom") or not isinstance(tool.get("input_schema"), dict):
            raise BadRequest(f"tools[{i}] ({tool.get('type') or tool['name']}): only custom tools with an "
                             "input_schema are supported")
        function = {"name": tool["name"], "parameters": tool["input_schema"]}
        if isinstance(tool.get("description"), str):
            function["description"] = tool["description"]
        functions.append({"type": "function", "function": function})
    kind = choice.get("type") if isinstance(choice, dict) else choice
    if kind is None or kind == "auto":
        return functions or None, "auto" if functions and kind else None
    if kind == "none":
        return None, None
    if not functions:
        raise BadRequest(f"tool_choice {kind!r} needs tools")
    if kind == "any":
        return functions, "required"
    name = choice.get("name") if kind == "tool" else None
    if not isinstance(name, str) or name not in {f["function"]["name"] for f in functions}:
        raise BadRequest("tool_choice must be {type: auto|any|none} or {type: tool, name} naming one of the tools")
    return functions, {"type": "function", "function": {"name": name}}


def _think(thinking: Any) -> bool | None:
    """enabled -> think, disabled -> don't, adaptive (and newer modes) or absent -> the model's default."""
    if thinking is None:
        return None
    if not isinstance(thinking, dict) or not isinstance(thinking.get("type"), str):
        raise BadRequest('thinking must be an object such as {"type": "enabled", "budget_tokens": 2048}')
    return {"enabled": True, "disabled": False}.get(thinking["type"])


def chat_request(body: Mapping[str, Any], *, count_only: bool = False) -> ChatRequest:
    """A /v1/messages body as the backend's ChatRequest (count_only: /count_tokens, no max_tokens)."""
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise BadRequest("model: field required")
    max_tokens = body.get("max_tokens")
    if not count_only and (max_tokens is None or isinstance(max_tokens, bool) or not isinstance(max_tokens, int)
                           or max_tokens < 1):
        raise BadRequest("max_tokens: field required, an integer >= 1")
    stop = body.get("stop_sequences")
    if stop is not None and (not isinstance(stop, list) or not all(isinstance(s, str) for s in stop)):
        raise BadRequest("stop_sequences must be an array of strings")
    temperature = body.get("temperature")
    if isinstance(temperature, (int, float)) and not isinstance(temperature, bool) and not 0 <= temperature <= 1:
        raise BadRequest(f"temperature: {temperature} is not in [0, 1], the Messages API's range")
    fields = {"max_tokens": max_tokens, "temperature": temperature, "top_p": body.get("top_p"),
              "top_k": body.get("top_k"), "stop": stop or None}
    tools, tool_choice = chat_tools(body.get("tools"), body.get("tool_choice"))
    return ChatRequest(model=model, messages=chat_messages(body.get("system"), body.get("messages")), tools=tools,
                       tool_choice=tool_choice, options=sampling_options(fields, tuple(fields)),
                       think=_think(body.get("thinking")), stream=bool(body.get("stream")), continue_final=True)


# -- responses --


def _usage(done: Done) -> dict[str, int]:
    """Anthropic's usage: input_tokens the prompt's tokens not read from the cache, the others in
    cache_read_input_tokens (ft caches every prompt's state, so nothing is billed as a creation)."""
    return {"input_tokens": done.prompt_tokens - done.cached_tokens, "output_tokens": done.completion_tokens,
            "cache_creation_input_tokens": 0, "cache_read_input_tokens": done.cached_tokens}


def _stop(done: Done, called_tools: bool) -> tuple[str, str | None]:
    if called_tools:
        return "tool_use", None
    reason = STOP_REASONS.get(done.stop_reason, "end_turn")
    return reason, done.stop_sequence if reason == "stop_sequence" else None


def _message(message_id: str, model: str, content: list[dict[str, Any]], done: Done | None,
             called_tools: bool) -> dict[str, Any]:
    reason, sequence = _stop(done, called_tools) if done else (None, None)
    return {"id": message_id, "type": "message", "role": "assistant", "model": model, "content": content,
            "stop_reason": reason, "stop_sequence": sequence, "usage": _usage(done or Done("stop"))}


def _tool_use(event: ToolCallEvent) -> dict[str, Any]:
    return {"type": "tool_use", "id": event.id, "name": event.name, "input": event.arguments}


def _content(events: list[Event]) -> list[dict[str, Any]]:
    """A finished generation's content blocks, consecutive deltas of one kind merged."""
    blocks: list[dict[str, Any]] = []
    for event in events:
        if isinstance(event, ToolCallEvent):
            blocks.append(_tool_use(event))
        elif isinstance(event, (TextDelta, ReasoningDelta)) and event.text:
            kind, field = ("text", "text") if isinstance(event, TextDelta) else ("thinking", "thinking")
            if blocks and blocks[-1]["type"] == kind:
                blocks[-1][field] += event.text
            else:
                blocks.append({"type": kind, field: event.text, **({"signature": ""} if kind == "thinking" else {})})
    return blocks


def _sse(event: str, data: dict[str, Any]) -> str:
    return f"event: {event}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"


async def _stream(events: AsyncIterator[Event], message_id: str, model: str, prompt_tokens: int) -> AsyncIterator[str]:
    start = _message(message_id, model, [], None, False)
    start["usage"]["input_tokens"] = prompt_tokens  # as the API reports it: known before any output
    yield _sse("message_start", {"type": "message_start", "message": start})
    index, open_kind, pinged, called, done = -1, None, False, False, Done("stop")

    def open_block(block: dict[str, Any]) -> list[str]:
        nonlocal index, open_kind, pinged
        out = close_block()
        index, open_kind = index + 1, block["type"]
        out.append(_sse("content_block_start", {"type": "content_block_start", "index": index, "content_block": block}))
        if not pinged:
            out.append(_sse("ping", {"type": "ping"}))
            pinged = True
        return out

    def close_block() -> list[str]:
        nonlocal open_kind
        if open_kind is None:
            return []
        open_kind = None
        return [_sse("content_block_stop", {"type": "content_block_stop", "index": index})]

    def delta(payload: dict[str, Any]) -> str:
        return _sse("content_block_delta", {"type": "content_block_delta", "index": index, "delta": payload})

    try:
        async for event in events:
            if isinstance(event, TextDelta) and event.text:
                if open_kind != "text":
                    for line in open_block({"type": "text", "text": ""}):
                        yield line
                yield delta({"type": "text_delta", "text": event.text})
            elif isinstance(event, ReasoningDelta) and event.text:
                if open_kind != "thinking":
                    for line in open_block({"type": "thinking", "thinking": "", "signature": ""}):
                        yield line
                yield delta({"type": "thinking_delta", "thinking": event.text})
            elif isinstance(event, ToolCallEvent):
                for line in open_block({**_tool_use(event), "input": {}}):
                    yield line
                yield delta({"type": "input_json_delta", "partial_json": json.dumps(event.arguments, ensure_ascii=False)})
                called = True
            elif isinstance(event, Done):
                done = event
    except Exception as e:
        yield _sse("error", error_body(as_server_error(e)))
        return
    for line in close_block():
        yield line
    if not pinged:
        yield _sse("ping", {"type": "ping"})
    reason, sequence = _stop(done, called)
    yield _sse("message_delta", {"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": sequence},
                                 "usage": _usage(done)})
    yield _sse("message_stop", {"type": "message_stop"})


def make_router(backend: Backend) -> APIRouter:
    """The Anthropic-compatible routes over `backend`."""
    router = APIRouter(route_class=guarded_route_class(lambda e: JSONResponse(error_body(e), status_code=e.status)))

    @router.post("/v1/messages")
    async def messages(request: Request) -> Response:
        chat = chat_request(await read_json(request))
        message_id = "msg_" + secrets.token_hex(12)
        if not chat.stream:
            events = await streaming.collect(backend.chat(chat), request)
            if events is None:
                return client_gone()
            done = next((e for e in events if isinstance(e, Done)), Done("stop"))
            called = any(isinstance(e, ToolCallEvent) for e in events)
            return JSONResponse(_message(message_id, chat.model, _content(events), done, called))
        prompt: list[Started] = []
        started = await events_after_start(backend.chat(chat), request, prompt.append)
        if started is None:
            return client_gone()
        return StreamingResponse(_stream(started, message_id, chat.model, prompt[0].prompt_tokens if prompt else 0),
                                 media_type="text/event-stream", headers=SSE_HEADERS)

    @router.post("/v1/messages/count_tokens")
    async def count_tokens(request: Request) -> Response:
        chat = chat_request(await read_json(request), count_only=True)
        return JSONResponse({"input_tokens": await run_in_threadpool(backend.count_tokens, chat)})

    return router
