"""OpenAI's Responses API: POST /v1/responses, the API OpenAI's Codex CLI speaks (its `wire_api =
"responses"`, the only one left since Codex 0.122).

A request's `instructions` and `input` (a string, or items: messages of input_text / output_text
parts, the model's `function_call`s and their `function_call_output`s, `reasoning` items, which
are dropped as a chat template would drop them) become the protocol's ChatRequest; function
tools become chat tools (other tool kinds, such as a hosted web search, are left out: a local
model has no such tool to call). The backend's events become a `response` object, or its
server-sent events in the order the API sends them: response.created and response.in_progress,
then per output item (reasoning, the message, each function call) output_item.added, its deltas
and its done events, then response.completed (or response.incomplete when the reply was cut at
max_output_tokens or the context) carrying the whole response. Stateless: `previous_response_id`
and `store` are refused or ignored as OpenAI's API without storage would, so a client sends the
whole conversation each turn, and the prefix cache (session_pool.py) makes that cheap.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse

from . import streaming
from .openai_api import (
    InvalidField,
    as_server_error,
    client_gone,
    error_body,
    events_after_start,
    guarded_route_class,
    read_json,
    sampling_options,
    sse_response,
)
from .protocol import Backend, ChatRequest, Done, Event, Message, ReasoningDelta, TextDelta, ToolCallEvent

TEXT_PARTS = ("input_text", "output_text", "text")


def _text(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise InvalidField(f"{where}.content must be a string or an array of text parts", f"{where}.content")
    texts = []
    for j, part in enumerate(content):
        if not isinstance(part, dict) or part.get("type") not in TEXT_PARTS or not isinstance(part.get("text"), str):
            raise InvalidField(f"{where}.content[{j}]: only text parts ({', '.join(TEXT_PARTS)}) are supported",
                               f"{where}.content[{j}]")
        texts.append(part["text"])
    return "".join(texts)


def input_messages(body: Mapping[str, Any]) -> list[Message]:
    """`instructions` and `input` as Hugging Face chat messages."""
    messages: list[Message] = []
    instructions = body.get("instructions")
    if isinstance(instructions, str) and instructions:
        messages.append({"role": "system", "content": instructions})
    raw = body.get("input")
    if isinstance(raw, str):
        return [*messages, {"role": "user", "content": raw}]
    if not isinstance(raw, list) or not raw:
        raise InvalidField("input must be a string or a non-empty array of items", "input")
    names: dict[str, str] = {}
    for i, item in enumerate(raw):
        where = f"input[{i}]"
        kind = item.get("type", "message") if isinstance(item, dict) else None
        if kind == "message":
            role = item.get("role")
            if role not in ("system", "developer", "user", "assistant"):
                raise InvalidField(f"{where}.role must be system, developer, user or assistant", f"{where}.role")
            text = _text(item.get("content"), where)
            messages.append({"role": "user" if role == "user" else "assistant" if role == "assistant" else "system",
                             "content": text})
        elif kind == "function_call":
            call_id, name, arguments = item.get("call_id"), item.get("name"), item.get("arguments", "{}")
            if not isinstance(call_id, str) or not isinstance(name, str) or not isinstance(arguments, str):
                raise InvalidField(f"{where}: a function_call has a call_id, a name and arguments as a JSON string",
                                   where)
            try:
                parsed = json.loads(arguments or "{}")
            except ValueError:
                raise InvalidField(f"{where}.arguments is not JSON", f"{where}.arguments") from None
            call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": parsed}}
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":  # its text, or parallel calls: one turn
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
            names[call_id] = name
        elif kind == "function_call_output":
            call_id, output = item.get("call_id"), item.get("output")
            if not isinstance(call_id, str):
                raise InvalidField(f"{where}.call_id is required", f"{where}.call_id")
            text = output if isinstance(output, str) else _text(output, where)
            message: Message = {"role": "tool", "tool_call_id": call_id, "content": text}
            if call_id in names:
                message["name"] = names[call_id]
            messages.append(message)
        elif kind == "reasoning":
            continue  # (the model's earlier reasoning: templates drop it from past turns)
        else:
            raise InvalidField(f"{where}.type {kind!r} is not supported (message, function_call, "
                               "function_call_output, reasoning)", f"{where}.type")
    return messages


def input_tools(body: Mapping[str, Any]) -> tuple[list[dict[str, Any]] | None, Any]:
    """Function tools as chat tools, and tool_choice as ChatRequest takes it."""
    raw = body.get("tools")
    if raw is not None and not isinstance(raw, list):
        raise InvalidField("tools must be an array", "tools")
    tools = []
    for i, tool in enumerate(raw or []):
        if not isinstance(tool, dict):
            raise InvalidField(f"tools[{i}] must be an object", f"tools[{i}]")
        if tool.get("type") != "function":
            continue  # a hosted tool (web search, file search, ...): nothing local to call
        if not isinstance(tool.get("name"), str):
            raise InvalidField(f"tools[{i}].name is required", f"tools[{i}].name")
        tools.append({"type": "function", "function": {k: tool[k] for k in ("name", "description", "parameters")
                                                       if k in tool}})
    choice = body.get("tool_choice")
    if not tools or choice in (None, "auto"):
        return tools or None, None
    if choice == "none":
        return None, None
    if choice == "required":
        return tools, "required"
    if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("name"), str):
        if choice["name"] not in {t["function"]["name"] for t in tools}:
            raise InvalidField(f"tool_choice names {choice['name']!r}, which is not among the tools", "tool_choice")
        return tools, {"type": "function", "function": {"name": choice["name"]}}
    raise InvalidField('tool_choice must be "none", "auto", "required" or {type: function, name}', "tool_choice")


def responses_request(body: Mapping[str, Any]) -> ChatRequest:
    """A /v1/responses body as the backend's ChatRequest (raises InvalidField)."""
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidField("model is required", "model")
    if body.get("previous_response_id"):
        raise InvalidField("previous_response_id: ft stores no responses; send the whole conversation as input",
                           "previous_response_id")
    text = body.get("text")
    if isinstance(text, dict) and isinstance(text.get("format"), dict) and text["format"].get("type") not in ("text", None):
        raise InvalidField("text.format: only text is supported", "text.format")
    options = {"max_tokens": body.get("max_output_tokens"), "temperature": body.get("temperature"),
               "top_p": body.get("top_p")}
    tools, tool_choice = input_tools(body)
    reasoning = body.get("reasoning")
    effort = reasoning.get("effort") if isinstance(reasoning, dict) else None
    return ChatRequest(model=model, messages=input_messages(body), tools=tools, tool_choice=tool_choice,
                       options=sampling_options(options, tuple(options)),
                       think=None if effort is None else effort != "none", stream=bool(body.get("stream")))


class _Response:
    """One response's identity, the output items it has made, and its final object."""

    def __init__(self, body: Mapping[str, Any], model: str) -> None:
        self.id, self.created, self.model, self.body = "resp_" + secrets.token_hex(12), int(time.time()), model, body
        self.output: list[dict[str, Any]] = []

    def object(self, status: str, done: Done | None = None) -> dict[str, Any]:
        incomplete = done is not None and done.stop_reason in ("length", "context")
        return {"id": self.id, "object": "response", "created_at": self.created, "model": self.model,
                "status": "incomplete" if incomplete else status, "error": None,
                "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
                "instructions": self.body.get("instructions"), "metadata": self.body.get("metadata") or {},
                "output": list(self.output), "parallel_tool_calls": True,
                "temperature": self.body.get("temperature"), "top_p": self.body.get("top_p"),
                "tool_choice": self.body.get("tool_choice", "auto"), "tools": self.body.get("tools") or [],
                "text": {"format": {"type": "text"}}, "usage": _usage(done) if done is not None else None}


def _usage(done: Done) -> dict[str, Any]:
    return {"input_tokens": done.prompt_tokens, "input_tokens_details": {"cached_tokens": done.cached_tokens},
            "output_tokens": done.completion_tokens, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": done.prompt_tokens + done.completion_tokens}


def _item_id(prefix: str) -> str:
    return prefix + secrets.token_hex(12)


def _message_item(item_id: str, text: str, status: str = "completed") -> dict[str, Any]:
    return {"type": "message", "id": item_id, "status": status, "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": []}] if status == "completed" else []}


def _reasoning_item(item_id: str, text: str) -> dict[str, Any]:
    return {"type": "reasoning", "id": item_id, "summary": [], "content": [{"type": "reasoning_text", "text": text}]}


def _call_item(event: ToolCallEvent, status: str = "completed") -> dict[str, Any]:
    return {"type": "function_call", "id": "fc_" + event.id.removeprefix("call_"), "call_id": event.id,
            "name": event.name, "arguments": json.dumps(event.arguments, ensure_ascii=False) if status == "completed"
            else "", "status": status}


def response_object(events: list[Event], reply: _Response) -> dict[str, Any]:
    reasoning = "".join(e.text for e in events if isinstance(e, ReasoningDelta))
    text = "".join(e.text for e in events if isinstance(e, TextDelta))
    calls = [e for e in events if isinstance(e, ToolCallEvent)]
    if reasoning:
        reply.output.append(_reasoning_item(_item_id("rs_"), reasoning))
    if text or not calls:
        reply.output.append(_message_item(_item_id("msg_"), text))
    reply.output.extend(_call_item(c) for c in calls)
    done = next((e for e in events if isinstance(e, Done)), Done("stop"))
    return reply.object("completed", done)


async def response_events(events: AsyncIterator[Event], reply: _Response) -> AsyncIterator[str]:
    """The response's server-sent events (`event:` and `data:` lines, each with its sequence number)."""
    sequence = 0

    def sse(kind: str, **fields: Any) -> str:
        nonlocal sequence
        data = {"type": kind, "sequence_number": sequence, **fields}
        sequence += 1
        return f"event: {kind}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"

    open_item: dict[str, Any] | None = None  # the reasoning or message item whose deltas are streaming
    open_text: list[str] = []

    def close() -> list[str]:
        nonlocal open_item
        if open_item is None:
            return []
        item, index, text = open_item, len(reply.output), "".join(open_text)
        open_item = None
        open_text.clear()
        if item["type"] == "message":
            done = _message_item(item["id"], text)
            out = [sse("response.output_text.done", item_id=item["id"], output_index=index, content_index=0, text=text,
                       logprobs=[]),
                   sse("response.content_part.done", item_id=item["id"], output_index=index, content_index=0,
                       part=done["content"][0])]
        else:
            done = _reasoning_item(item["id"], text)
            out = [sse("response.reasoning_text.done", item_id=item["id"], output_index=index, content_index=0,
                       text=text)]
        reply.output.append(done)
        return [*out, sse("response.output_item.done", output_index=index, item=done)]

    def open_(kind: str) -> list[str]:
        nonlocal open_item
        out = close()
        index = len(reply.output)
        if kind == "message":
            open_item = _message_item(_item_id("msg_"), "", status="in_progress")
            out.append(sse("response.output_item.added", output_index=index, item=open_item))
            out.append(sse("response.content_part.added", item_id=open_item["id"], output_index=index, content_index=0,
                           part={"type": "output_text", "text": "", "annotations": []}))
        else:
            open_item = {"type": "reasoning", "id": _item_id("rs_"), "summary": []}
            out.append(sse("response.output_item.added", output_index=index, item=open_item))
        return out

    yield sse("response.created", response=reply.object("in_progress"))
    yield sse("response.in_progress", response=reply.object("in_progress"))
    done, called = Done("stop"), False
    try:
        async for event in events:
            if isinstance(event, (TextDelta, ReasoningDelta)) and event.text:
                kind = "message" if isinstance(event, TextDelta) else "reasoning"
                if open_item is None or open_item["type"] != kind:
                    for line in open_(kind):
                        yield line
                open_text.append(event.text)
                index = len(reply.output)
                delta = "response.output_text.delta" if kind == "message" else "response.reasoning_text.delta"
                extra = {"logprobs": []} if kind == "message" else {}
                yield sse(delta, item_id=open_item["id"], output_index=index, content_index=0, delta=event.text,
                          **extra)
            elif isinstance(event, ToolCallEvent):
                for line in close():
                    yield line
                index, called = len(reply.output), True
                yield sse("response.output_item.added", output_index=index, item=_call_item(event, "in_progress"))
                item = _call_item(event)
                yield sse("response.function_call_arguments.delta", item_id=item["id"], output_index=index,
                          delta=item["arguments"])
                yield sse("response.function_call_arguments.done", item_id=item["id"], output_index=index,
                          name=item["name"], arguments=item["arguments"])
                reply.output.append(item)
                yield sse("response.output_item.done", output_index=index, item=item)
            elif isinstance(event, Done):
                done = event
    except Exception as e:
        failed = reply.object("failed")
        failed["error"] = error_body(as_server_error(e))["error"]
        yield sse("response.failed", response=failed)
        return
    if open_item is None and not called and not any(item["type"] == "message" for item in reply.output):
        for line in open_("message"):  # (an empty reply is still a message)
            yield line
    for line in close():
        yield line
    final = reply.object("completed", done)
    yield sse("response.incomplete" if final["status"] == "incomplete" else "response.completed", response=final)


def make_router(backend: Backend) -> APIRouter:
    """POST /v1/responses over `backend`."""
    router = APIRouter(route_class=guarded_route_class(lambda e: JSONResponse(error_body(e), status_code=e.status)))

    @router.post("/v1/responses")
    async def responses(request: Request) -> Response:
        body = await read_json(request)
        chat = responses_request(body)
        reply = _Response(body, chat.model)
        if not chat.stream:
            events = await streaming.collect(backend.chat(chat), request)
            return client_gone() if events is None else JSONResponse(response_object(events, reply))
        started = await events_after_start(backend.chat(chat), request)
        return client_gone() if started is None else sse_response(response_events(started, reply))

    return router
