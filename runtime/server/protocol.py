"""The server's internal language: what every API flavour translates requests into, and the
events a generation streams back. Flavours (ollama_api, openai_api, anthropic_api) only
translate; the backend owns models, queueing and generation.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

Message = dict[str, Any]  # Hugging Face chat format: role, content, tool_calls, tool_call_id, name, reasoning_content


@dataclass(frozen=True)
class ChatRequest:
    model: str
    messages: list[Message]
    tools: list[dict[str, Any]] | None = None  # OpenAI-style {"type": "function", "function": {name, description, parameters}}
    tool_choice: Any = None  # "auto" | "none" | "required" | {"type": "function", "function": {"name": ...}}
    options: dict[str, Any] = field(default_factory=dict)  # sampling options, Ollama or OpenAI names
    think: bool | None = None  # ask a reasoning model to think (None: the model's default)
    keep_alive: float | None = None  # seconds to keep the model loaded after this request; None: default
    stream: bool = True
    # a final assistant message is the start of the reply, which continues it (Anthropic's and
    # Ollama's prefill; vLLM's continue_final_message), instead of a turn of its own
    continue_final: bool = False


@dataclass(frozen=True)
class GenerateRequest:
    """A completion: `prompt` is rendered through the chat template unless `raw`."""

    model: str
    prompt: str
    system: str | None = None
    raw: bool = False
    suffix: str | None = None
    options: dict[str, Any] = field(default_factory=dict)
    think: bool | None = None
    keep_alive: float | None = None
    stream: bool = True
    # max_tokens where neither the request nor the model's recipe sets one (the legacy OpenAI
    # completions endpoint's documented 16); None: until the context is full
    default_max_tokens: int | None = None


@dataclass(frozen=True)
class Started:
    """The generation is queued to run: its prompt fits the context and counts `prompt_tokens`
    (a forced call's opening not among them: it is the reply's). Sent before anything it writes;
    the API flavours' streaming helpers take it out of the stream (streaming.start `on_started`)."""

    prompt_tokens: int


@dataclass(frozen=True)
class TextDelta:
    text: str


@dataclass(frozen=True)
class ReasoningDelta:
    text: str


@dataclass(frozen=True)
class ToolCallEvent:
    id: str
    name: str
    arguments: dict[str, Any]


StopReason = Literal["stop", "length", "tool_calls", "stop_sequence", "context"]


@dataclass(frozen=True)
class Done:
    stop_reason: StopReason
    stop_sequence: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0  # of prompt_tokens, those whose state was kept from an earlier request (not computed)
    load_seconds: float = 0.0
    prompt_seconds: float = 0.0
    eval_seconds: float = 0.0
    total_seconds: float = 0.0


Event = Started | TextDelta | ReasoningDelta | ToolCallEvent | Done


@dataclass(frozen=True)
class ModelInfo:
    name: str  # display name, e.g. "qwen3-30b-a3b:latest"
    digest: str
    size_bytes: int
    modified_at: float
    family: str | None
    dtype: str | None
    parameters: int | None
    context_length: int | None


class ServerError(Exception):
    """An error with an HTTP status; flavours render it in their own error shape."""

    status = 500

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class BadRequest(ServerError):
    status = 400


class ModelNotFound(ServerError):
    status = 404


class Busy(ServerError):
    status = 503


class NotImplementedByFt(ServerError):
    """A feature of the API that ft does not have (embeddings, pushing models, ...)."""

    status = 501


class Backend(Protocol):
    """What the API flavours call. Implemented by the model manager (runtime/server/backend.py)."""

    def chat(self, request: ChatRequest) -> AsyncIterator[Event]:
        """Stream a chat completion; the last event is Done. Raises ServerError subclasses."""
        ...

    def generate(self, request: GenerateRequest) -> AsyncIterator[Event]:
        """Stream a completion of a prompt; the last event is Done."""
        ...

    def count_tokens(self, request: ChatRequest) -> int:
        """Prompt tokens `request` would take (chat template applied)."""
        ...

    def list_models(self) -> list[ModelInfo]:
        ...
