"""The OpenAI API flavour: /v1/chat/completions, /v1/completions, /v1/models.

Requests are translated into the protocol's ChatRequest / GenerateRequest (messages in Hugging
Face chat format, tool-call arguments as objects) and the backend's events back into OpenAI's
objects or `chat.completion.chunk` server-sent events. Reasoning travels as `reasoning_content`,
as vLLM and DeepSeek send it. Errors come back as {"error": {message, type, param, code}}.
"""

from __future__ import annotations

import json
import logging
import secrets
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse
from fastapi.routing import APIRoute

from ..text.sampling import InvalidParameterError, SamplingParams
from . import streaming
from .limits import too_deep
from .protocol import (
    Backend,
    BadRequest,
    ChatRequest,
    Done,
    Event,
    GenerateRequest,
    Message,
    ModelInfo,
    ModelNotFound,
    NotImplementedByFt,
    ReasoningDelta,
    ServerError,
    Started,
    TextDelta,
    ToolCallEvent,
)

log = logging.getLogger(__name__)

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
# request fields passed to the sampler as they are (SamplingParams.from_options knows these names)
SAMPLING_FIELDS = ("max_tokens", "max_completion_tokens", "temperature", "top_p", "seed", "stop",
                   "presence_penalty", "frequency_penalty", "top_k", "min_p", "repetition_penalty")
FINISH_REASONS = {"stop": "stop", "stop_sequence": "stop", "length": "length", "context": "length",
                  "tool_calls": "tool_calls"}


class InvalidField(BadRequest):
    """A bad request naming the offending field (OpenAI's `param`)."""

    def __init__(self, message: str, param: str | None) -> None:
        super().__init__(message)
        self.param = param


def error_body(error: ServerError) -> dict[str, Any]:
    kind = "invalid_request_error" if error.status < 500 else "server_error"
    code = "model_not_found" if isinstance(error, ModelNotFound) else "overloaded" if error.status == 503 else None
    return {"error": {"message": error.message, "type": kind, "param": getattr(error, "param", None), "code": code}}


def guarded_route_class(render: Callable[[ServerError], Response]) -> type[APIRoute]:
    """Routes whose ServerErrors (and crashes, as 500s) come back as `render` draws them."""

    class GuardedRoute(APIRoute):
        def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
            handler = super().get_route_handler()

            async def guarded(request: Request) -> Response:
                try:
                    return await handler(request)
                except ServerError as e:
                    return render(e)
                except Exception:
                    log.exception("%s %s failed", request.method, request.url.path)
                    return render(ServerError("internal error; see the server log"))

            return guarded

    return GuardedRoute


async def read_json(request: Request) -> dict[str, Any]:
    try:
        body = await request.json()
    except ValueError:
        raise BadRequest("the request body is not valid JSON") from None
    except RecursionError:  # (app.BodyLimits refuses such a body first; a router mounted without it)
        raise BadRequest("the request body's JSON nests too deeply") from None
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    return body


async def _chain(first: Event, rest: AsyncIterator[Event]) -> AsyncIterator[Event]:
    yield first
    async for event in rest:
        yield event


async def events_after_start(events: AsyncIterator[Event], request: Request,
                             on_started: Callable[[Started], object] | None = None) -> AsyncIterator[Event] | None:
    """The stream with its first event awaited, so that an error raised before any output (unknown
    model, busy) becomes the response's status; None when the client left meanwhile. The
    backend's Started goes to `on_started` (streaming.start)."""
    started = await streaming.start(events, request, on_started)
    return None if started is None else _chain(*started)


def as_server_error(error: Exception) -> ServerError:
    """A crash mid-stream, as an error the flavour can still send (after logging it)."""
    if isinstance(error, ServerError):
        return error
    log.error("generation failed", exc_info=error)
    return ServerError("generation failed; see the server log")


def client_gone() -> Response:
    return Response(status_code=499)  # nobody reads it: the client has disconnected


# -- requests --


def _text(content: Any, where: str, *, allow_none: bool = False) -> str:
    """A message's text: a string, or an array of text parts (joined by newlines)."""
    if isinstance(content, str):
        return content
    if content is None and allow_none:
        return ""
    if not isinstance(content, list):
        raise InvalidField(f"{where}.content must be a string or an array of content parts", f"{where}.content")
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text" and isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif kind == "refusal":
            continue
        else:
            raise InvalidField(f"{where}.content[{j}]: only text content is supported (got {kind or part!r}); "
                               "the models ft serves read text only", f"{where}.content[{j}]")
    return "\n".join(texts)


def _arguments(raw: Any, where: str) -> dict[str, Any]:
    if isinstance(raw, str):
        if problem := too_deep(raw):  # (JSON inside a string: the body's own scan did not count it)
            raise InvalidField(f"{where}: {problem}", where)
        try:
            raw = json.loads(raw) if raw.strip() else {}
        except ValueError:
            raise InvalidField(f"{where} is not valid JSON", where) from None
    if not isinstance(raw, dict):
        raise InvalidField(f"{where} must be a JSON object", where)
    return raw


def _tool_call(call: Any, where: str) -> dict[str, Any]:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise InvalidField(f"{where} must be {{id, type: function, function: {{name, arguments}}}}", where)
    converted: dict[str, Any] = {"type": "function", "function": {
        "name": function["name"], "arguments": _arguments(function.get("arguments"), f"{where}.function.arguments")}}
    if isinstance(call.get("id"), str):
        converted["id"] = call["id"]
    return converted


def chat_messages(raw: Any) -> list[Message]:
    """OpenAI messages -> Hugging Face chat format (system, user, assistant with tool_calls, tool)."""
    if not isinstance(raw, list) or not raw:
        raise InvalidField("messages must be a non-empty array", "messages")
    names: dict[str, str] = {}  # tool_call_id -> function name, for templates that print it
    messages: list[Message] = []
    for i, message in enumerate(raw):
        where = f"messages[{i}]"
        role = message.get("role") if isinstance(message, dict) else None
        if role in ("system", "developer", "user"):
            messages.append({"role": "user" if role == "user" else "system", "content": _text(message.get("content"), where)})
        elif role == "assistant":
            converted: Message = {"role": "assistant", "content": _text(message.get("content"), where, allow_none=True)}
            reasoning = message.get("reasoning_content") or message.get("reasoning")
            if isinstance(reasoning, str) and reasoning:
                converted["reasoning_content"] = reasoning
            if calls := message.get("tool_calls"):
                if not isinstance(calls, list):
                    raise InvalidField(f"{where}.tool_calls must be an array", f"{where}.tool_calls")
                converted["tool_calls"] = [_tool_call(c, f"{where}.tool_calls[{j}]") for j, c in enumerate(calls)]
                names.update((c["id"], c["function"]["name"]) for c in converted["tool_calls"] if "id" in c)
            messages.append(converted)
        elif role == "tool":
            call_id = message.get("tool_call_id")
            if not isinstance(call_id, str):
                raise InvalidField(f"{where}.tool_call_id is required for a tool message", f"{where}.tool_call_id")
            converted = {"role": "tool", "tool_call_id": call_id, "content": _text(message.get("content"), where)}
            name = names.get(call_id) or message.get("name")
            if isinstance(name, str) and name:
                converted["name"] = name
            messages.append(converted)
        else:
            raise InvalidField(f"{where}.role must be system, developer, user, assistant or tool (got {role!r})",
                               f"{where}.role")
    return messages


def chat_tools(body: Mapping[str, Any]) -> tuple[list[dict[str, Any]] | None, Any]:
    """The request's tools and tool_choice as ChatRequest takes them ("none" drops the tools)."""
    tools, choice = body.get("tools"), body.get("tool_choice")
    if tools is not None and not isinstance(tools, list):
        raise InvalidField("tools must be an array", "tools")
    for i, tool in enumerate(tools or []):
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(function, dict) or tool.get("type") != "function" or not isinstance(function.get("name"), str):
            raise InvalidField(f"tools[{i}] must be {{type: function, function: {{name, description, parameters}}}}",
                               f"tools[{i}]")
    names = {t["function"]["name"] for t in tools or []}
    if choice is None or choice == "auto":
        return tools or None, choice if tools else None
    if choice == "none":
        return None, None
    if choice == "required":
        if not tools:
            raise InvalidField('tool_choice "required" needs tools', "tool_choice")
        return tools, choice
    function = choice.get("function") if isinstance(choice, dict) else None
    name = function.get("name") if isinstance(function, dict) else None
    if not isinstance(name, str):
        raise InvalidField('tool_choice must be "none", "auto", "required" or {type: function, function: {name}}',
                           "tool_choice")
    if name not in names:
        raise InvalidField(f"tool_choice names {name!r}, which is not among the tools", "tool_choice")
    return tools, {"type": "function", "function": {"name": name}}


# the legacy completions endpoint's max_tokens when a request gives none (OpenAI's documented
# default, and vLLM's): without it an autocomplete call ran until the context was full
COMPLETIONS_DEFAULT_MAX_TOKENS = 16


def sampling_options(body: Mapping[str, Any], fields: tuple[str, ...] = SAMPLING_FIELDS) -> dict[str, Any]:
    options = {name: body[name] for name in fields if body.get(name) is not None}
    try:
        SamplingParams.from_options(options)
    except InvalidParameterError as e:
        raise InvalidField(str(e), e.name) from None
    return options


def _think(body: Mapping[str, Any]) -> bool | None:
    kwargs = body.get("chat_template_kwargs")
    for value in (body.get("think"), kwargs.get("enable_thinking") if isinstance(kwargs, dict) else None):
        if isinstance(value, bool):
            return value
    effort = body.get("reasoning_effort")
    return None if effort is None else effort != "none"


def _check_unsupported(body: Mapping[str, Any]) -> None:
    if body.get("n") not in (None, 1):
        raise InvalidField("n: only one choice per request is supported", "n")
    if body.get("logprobs"):
        raise InvalidField("logprobs are not supported", "logprobs")
    response_format = body.get("response_format")
    if isinstance(response_format, dict) and response_format.get("type") not in (None, "text"):
        raise InvalidField("response_format: only text is supported", "response_format")


def _model(body: Mapping[str, Any]) -> str:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidField("model is required", "model")
    return model


def chat_request(body: Mapping[str, Any]) -> ChatRequest:
    """A /v1/chat/completions body as the backend's ChatRequest (raises InvalidField)."""
    _check_unsupported(body)
    tools, tool_choice = chat_tools(body)
    return ChatRequest(model=_model(body), messages=chat_messages(body.get("messages")), tools=tools,
                       tool_choice=tool_choice, options=sampling_options(body), think=_think(body),
                       stream=bool(body.get("stream")), continue_final=body.get("continue_final_message") is True)


# -- responses --


def _usage(done: Done) -> dict[str, Any]:
    """OpenAI's usage: prompt_tokens the whole prompt, the share served from the prefix cache in
    prompt_tokens_details.cached_tokens."""
    return {"prompt_tokens": done.prompt_tokens, "completion_tokens": done.completion_tokens,
            "total_tokens": done.prompt_tokens + done.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": done.cached_tokens}}


def _finish_reason(done: Done, called_tools: bool) -> str:
    return "tool_calls" if called_tools else FINISH_REASONS.get(done.stop_reason, "stop")


def _tool_call_out(event: ToolCallEvent, index: int | None = None) -> dict[str, Any]:
    call = {"id": event.id, "type": "function",
            "function": {"name": event.name, "arguments": json.dumps(event.arguments, ensure_ascii=False)}}
    return call if index is None else {"index": index, **call}


def sse(data: Any) -> str:
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n"


class _Reply:
    """Identity shared by every object of one response."""

    def __init__(self, prefix: str, model: str) -> None:
        self.id = prefix + secrets.token_hex(12)
        self.created = int(time.time())
        self.model = model

    def head(self, kind: str) -> dict[str, Any]:
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model}


async def _chat_chunks(events: AsyncIterator[Event], reply: _Reply, include_usage: bool) -> AsyncIterator[str]:
    def chunk(delta: dict[str, Any], finish: str | None = None) -> str:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        return sse({**reply.head("chat.completion.chunk"), "system_fingerprint": None, "choices": [choice],
                    **({"usage": None} if include_usage else {})})

    yield chunk({"role": "assistant", "content": ""})
    done, calls = Done("stop"), 0
    try:
        async for event in events:
            if isinstance(event, TextDelta) and event.text:
                yield chunk({"content": event.text})
            elif isinstance(event, ReasoningDelta) and event.text:
                yield chunk({"reasoning_content": event.text})
            elif isinstance(event, ToolCallEvent):
                yield chunk({"tool_calls": [_tool_call_out(event, calls)]})
                calls += 1
            elif isinstance(event, Done):
                done = event
    except Exception as e:
        yield sse(error_body(as_server_error(e)))
        return
    yield chunk({}, _finish_reason(done, calls > 0))
    if include_usage:
        yield sse({**reply.head("chat.completion.chunk"), "system_fingerprint": None, "choices": [],
                   "usage": _usage(done)})
    yield "data: [DONE]\n\n"


def _chat_object(events: list[Event], reply: _Reply) -> dict[str, Any]:
    text = "".join(e.text for e in events if isinstance(e, TextDelta))
    reasoning = "".join(e.text for e in events if isinstance(e, ReasoningDelta))
    calls = [_tool_call_out(e) for e in events if isinstance(e, ToolCallEvent)]
    done = next((e for e in events if isinstance(e, Done)), Done("stop"))
    message: dict[str, Any] = {"role": "assistant", "content": text or (None if calls else "")}
    if reasoning:
        message["reasoning_content"] = reasoning
    if calls:
        message["tool_calls"] = calls
    choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": _finish_reason(done, bool(calls))}
    return {**reply.head("chat.completion"), "system_fingerprint": None, "choices": [choice], "usage": _usage(done)}


async def _completion_chunks(events: AsyncIterator[Event], reply: _Reply, include_usage: bool,
                             echo: str) -> AsyncIterator[str]:
    def chunk(text: str, finish: str | None = None) -> str:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
        return sse({**reply.head("text_completion"), "choices": [choice], **({"usage": None} if include_usage else {})})

    if echo:
        yield chunk(echo)
    done = Done("stop")
    try:
        async for event in events:
            if isinstance(event, TextDelta) and event.text:
                yield chunk(event.text)
            elif isinstance(event, Done):
                done = event
    except Exception as e:
        yield sse(error_body(as_server_error(e)))
        return
    yield chunk("", _finish_reason(done, False))
    if include_usage:
        yield sse({**reply.head("text_completion"), "choices": [], "usage": _usage(done)})
    yield "data: [DONE]\n\n"


def _completion_object(events: list[Event], reply: _Reply, echo: str) -> dict[str, Any]:
    text = echo + "".join(e.text for e in events if isinstance(e, TextDelta))
    done = next((e for e in events if isinstance(e, Done)), Done("stop"))
    choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": _finish_reason(done, False)}
    return {**reply.head("text_completion"), "choices": [choice], "usage": _usage(done)}


def sse_response(chunks: AsyncIterator[str]) -> StreamingResponse:
    return StreamingResponse(chunks, media_type="text/event-stream", headers=SSE_HEADERS)


def _include_usage(body: Mapping[str, Any]) -> bool:
    options = body.get("stream_options")
    return isinstance(options, dict) and bool(options.get("include_usage"))


def _completion_request(body: Mapping[str, Any]) -> GenerateRequest:
    _check_unsupported(body)
    prompt, suffix = body.get("prompt"), body.get("suffix")
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]
    if not isinstance(prompt, str):
        raise InvalidField("prompt must be a string (one prompt per request)", "prompt")
    if suffix is not None and not isinstance(suffix, str):
        raise InvalidField("suffix must be a string", "suffix")
    return GenerateRequest(model=_model(body), prompt=prompt, raw=True, suffix=suffix,
                           options=sampling_options(body), stream=bool(body.get("stream")),
                           default_max_tokens=COMPLETIONS_DEFAULT_MAX_TOKENS)


def _model_object(info: ModelInfo) -> dict[str, Any]:
    return {"id": info.name, "object": "model", "created": int(info.modified_at), "owned_by": "ft"}


def _find_model(backend: Backend, model_id: str) -> ModelInfo:
    for info in backend.list_models():
        if model_id in (info.name, info.name.removesuffix(":latest")):
            return info
    raise ModelNotFound(f"model {model_id!r} not found; `ft list` shows the local models, `ft pull` gets more")


def make_router(backend: Backend) -> APIRouter:
    """The OpenAI-compatible routes over `backend`."""
    router = APIRouter(route_class=guarded_route_class(lambda e: JSONResponse(error_body(e), status_code=e.status)))

    @router.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        body = await read_json(request)
        chat = chat_request(body)
        reply = _Reply("chatcmpl-", chat.model)
        if not chat.stream:
            events = await streaming.collect(backend.chat(chat), request)
            return client_gone() if events is None else JSONResponse(_chat_object(events, reply))
        started = await events_after_start(backend.chat(chat), request)
        return client_gone() if started is None else sse_response(_chat_chunks(started, reply, _include_usage(body)))

    @router.post("/v1/completions")
    async def completions(request: Request) -> Response:
        body = await read_json(request)
        generate = _completion_request(body)
        reply = _Reply("cmpl-", generate.model)
        echo = generate.prompt if body.get("echo") else ""
        if not generate.stream:
            events = await streaming.collect(backend.generate(generate), request)
            return client_gone() if events is None else JSONResponse(_completion_object(events, reply, echo))
        started = await events_after_start(backend.generate(generate), request)
        if started is None:
            return client_gone()
        return sse_response(_completion_chunks(started, reply, _include_usage(body), echo))

    @router.post("/v1/embeddings")
    async def embeddings() -> Response:
        raise NotImplementedByFt("embeddings are not supported by ft: its models are chat models")

    @router.get("/v1/models")
    async def list_models() -> Response:
        return JSONResponse({"object": "list", "data": [_model_object(m) for m in backend.list_models()]})

    @router.get("/v1/models/{model_id:path}")
    async def get_model(model_id: str) -> Response:
        return JSONResponse(_model_object(_find_model(backend, model_id)))

    return router
