"""Ollama's wire format: request bodies (pydantic, so FastAPI validates them and writes the
OpenAPI document) and the translation between them and the protocol (messages in, NDJSON chunks
out, durations in nanoseconds), after Ollama's docs/api.md and the `ollama` package's types.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from .limits import too_deep
from .protocol import BadRequest, Done, Event, ReasoningDelta, TextDelta, ToolCallEvent
from .scheduler import parse_keep_alive

ROLES = ("system", "user", "assistant", "tool")
DONE_REASONS = {"stop": "stop", "stop_sequence": "stop", "tool_calls": "stop", "length": "length", "context": "length"}
FOREVER = "9999-12-31T23:59:59Z"  # expires_at of a model kept loaded until unloaded


# ---- request bodies (validated by FastAPI; errors become 400 with the field) -----------------------

class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")


class ToolCallFunction(_Body):
    name: str
    arguments: dict[str, Any] | str = Field(default_factory=dict)


class ToolCall(_Body):
    id: str | None = None
    function: ToolCallFunction


class Message(_Body):
    role: str
    content: str | None = ""
    thinking: str | None = None
    images: list[str] | None = None
    tool_calls: list[ToolCall] | None = None
    tool_name: str | None = None


class _GenerationBody(_Body):
    model: str = Field(min_length=1)
    format: str | dict[str, Any] | None = None
    options: dict[str, Any] | None = None
    stream: bool = True
    keep_alive: float | str | None = None
    think: bool | str | None = None


class ChatBody(_GenerationBody):
    messages: list[Message] = Field(default_factory=list)
    tools: list[dict[str, Any]] | None = None


class GenerateBody(_GenerationBody):
    prompt: str = ""
    suffix: str | None = None
    system: str | None = None
    template: str | None = None
    context: list[int] | None = None
    raw: bool = False
    images: list[str] | None = None


class ModelBody(_Body):
    """Ollama takes `model`; older clients send `name`."""

    model: str | None = None
    name: str | None = None

    @property
    def target(self) -> str:
        target = self.model or self.name
        if not target:
            raise BadRequest("model is required")
        return target


class ShowBody(ModelBody):
    verbose: bool = False


class PullBody(ModelBody):
    insecure: bool = False
    stream: bool = True


class CopyBody(_Body):
    source: str = Field(min_length=1)
    destination: str = Field(min_length=1)


class CreateMessage(_Body):
    role: str = Field(min_length=1)
    content: str


class CreateBody(ModelBody):
    """Ollama's /api/create: a model FROM a stored one, with its own system prompt, template,
    parameters, messages and license (what a Modelfile says); or, as older clients send it, the
    Modelfile itself. `files`, `adapters` and `quantize` (weights uploaded with /api/blobs, LoRA
    adapters, re-quantizing) are refused by the endpoint with what to do instead."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)
    from_: str | None = Field(default=None, alias="from")
    modelfile: str | None = None
    system: str | None = None
    template: str | None = None
    license: str | list[str] | None = None
    parameters: dict[str, Any] | None = None
    messages: list[CreateMessage] | None = None
    files: dict[str, str] | None = None
    adapters: dict[str, str] | None = None
    quantize: str | None = None
    stream: bool = True


# ---- translation ---------------------------------------------------------------------------------

def now() -> str:
    return datetime.now(timezone.utc).isoformat().replace("+00:00", "Z")


def timestamp(seconds: float) -> str:
    try:
        return datetime.fromtimestamp(seconds, timezone.utc).isoformat().replace("+00:00", "Z")
    except (OverflowError, OSError, ValueError):  # beyond what a datetime holds
        return FOREVER


def ns(seconds: float) -> int:
    return int(round(seconds * 1e9))


def keep_alive(value: float | str | None) -> float | None:
    if value is None:
        return None
    try:
        return parse_keep_alive(value)
    except ValueError as e:
        raise BadRequest(str(e)) from None


def think(value: bool | str | None) -> bool | None:
    if value is None or isinstance(value, bool):
        return value
    if value in ("high", "medium", "low"):
        return True
    raise BadRequest(f"invalid think {value!r}: true, false, or an effort: high, medium, low")


def check_format(value: str | dict[str, Any] | None) -> None:
    if value not in (None, ""):
        raise BadRequest("format (JSON mode, structured outputs) is not supported by ft yet; ask for JSON in the prompt")


def messages_in(messages: list[Message]) -> list[dict[str, Any]]:
    """Ollama messages -> Hugging Face chat messages (what chat templates read)."""
    out = []
    for i, m in enumerate(messages):
        if m.role not in ROLES:
            raise BadRequest(f"messages[{i}].role must be one of {', '.join(ROLES)}, not {m.role!r}")
        if m.images:
            raise BadRequest(f"messages[{i}].images: ft's models read text only")
        message: dict[str, Any] = {"role": m.role, "content": m.content or ""}
        if m.thinking:
            message["reasoning_content"] = m.thinking
        if m.tool_name:
            message["name"] = m.tool_name
        if m.tool_calls:
            message["tool_calls"] = [_tool_call_in(i, j, call) for j, call in enumerate(m.tool_calls)]
        out.append(message)
    return out


def _tool_call_in(i: int, j: int, call: ToolCall) -> dict[str, Any]:
    arguments = call.function.arguments
    if isinstance(arguments, str):
        if problem := too_deep(arguments):  # (JSON inside a string: the body's own scan did not count it)
            raise BadRequest(f"messages[{i}].tool_calls[{j}].function.arguments: {problem}")
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except ValueError:
            raise BadRequest(f"messages[{i}].tool_calls[{j}].function.arguments is not a JSON object") from None
        if not isinstance(arguments, dict):
            raise BadRequest(f"messages[{i}].tool_calls[{j}].function.arguments must be a JSON object")
    return {"type": "function", "id": call.id or f"call_{i}_{j}",
            "function": {"name": call.function.name, "arguments": arguments}}


def tool_call_out(event: ToolCallEvent) -> dict[str, Any]:
    return {"id": event.id, "function": {"name": event.name, "arguments": event.arguments}}


def done_fields(done: Done) -> dict[str, Any]:
    return {
        "done": True,
        "done_reason": DONE_REASONS.get(done.stop_reason, "stop"),
        "total_duration": ns(done.total_seconds),
        "load_duration": ns(done.load_seconds),
        "prompt_eval_count": done.prompt_tokens,  # the whole prompt, cached tokens included, as Ollama counts it
        "prompt_eval_duration": ns(done.prompt_seconds),
        "eval_count": done.completion_tokens,
        "eval_duration": ns(done.eval_seconds),
        **({"prompt_eval_cached_count": done.cached_tokens} if done.cached_tokens else {}),  # (omitted at 0, as Ollama)
    }


def line(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj, ensure_ascii=False).encode() + b"\n"


def parameter_size(n: int | None) -> str:
    if not n:
        return ""
    for div, unit in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= div:
            return f"{n / div:.1f}{unit}"
    return str(n)


def details(family: str | None, dtype: str | None, parameters: int | None) -> dict[str, Any]:
    return {"parent_model": "", "format": "ftw", "family": family or "", "families": [family] if family else None,
            "parameter_size": parameter_size(parameters), "quantization_level": (dtype or "").upper()}


def parameters_text(parameters: dict[str, Any]) -> str:
    """Recipe parameters as Ollama prints them: one `name value` line each, strings quoted."""
    rows = []
    for key, value in parameters.items():
        for v in value if isinstance(value, list) else [value]:
            rows.append(f"{key:<30} {json.dumps(v) if isinstance(v, str) else v}")
    return "\n".join(rows)


def model_info(family: str | None, config: dict[str, Any]) -> dict[str, Any]:
    arch = family or "unknown"
    info: dict[str, Any] = {"general.architecture": arch, "general.parameter_count": config.get("num_params_total"),
                            "general.file_type": config.get("dtype")}
    for key, field in (("context_length", "context_length"), ("embedding_length", "hidden_size"),
                       ("block_count", "num_layers"), ("expert_count", "num_experts"),
                       ("expert_used_count", "num_experts_per_tok"), ("expert_shared_count", "num_shared_experts"),
                       ("expert_feed_forward_length", "moe_intermediate_size"), ("vocab_size", "vocab_size")):
        if config.get(field) is not None:
            info[f"{arch}.{key}"] = config[field]
    info["ft.parameters_active"] = config.get("num_params_active")
    return info


def chat_chunk(event: Event) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": ""}
    if isinstance(event, TextDelta):
        message["content"] = event.text
    elif isinstance(event, ReasoningDelta):
        message["thinking"] = event.text
    elif isinstance(event, ToolCallEvent):
        message["tool_calls"] = [tool_call_out(event)]
    elif isinstance(event, Done):
        return {"message": message, **done_fields(event)}
    return {"message": message, "done": False}


def chat_final(events: list[Event]) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": "".join(e.text for e in events if isinstance(e, TextDelta))}
    thinking = "".join(e.text for e in events if isinstance(e, ReasoningDelta))
    if thinking:
        message["thinking"] = thinking
    calls = [tool_call_out(e) for e in events if isinstance(e, ToolCallEvent)]
    if calls:
        message["tool_calls"] = calls
    done = next(e for e in events if isinstance(e, Done))
    return {"message": message, **done_fields(done)}


def generate_chunk(event: Event) -> dict[str, Any]:
    if isinstance(event, Done):
        return {"response": "", **done_fields(event)}
    out: dict[str, Any] = {"response": event.text if isinstance(event, TextDelta) else "", "done": False}
    if isinstance(event, ReasoningDelta):
        out["thinking"] = event.text
    return out


def generate_final(events: list[Event]) -> dict[str, Any]:
    out: dict[str, Any] = {"response": "".join(e.text for e in events if isinstance(e, TextDelta))}
    thinking = "".join(e.text for e in events if isinstance(e, ReasoningDelta))
    if thinking:
        out["thinking"] = thinking
    done = next(e for e in events if isinstance(e, Done))
    return {**out, **done_fields(done)}
