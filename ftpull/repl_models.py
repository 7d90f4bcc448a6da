"""The REPL's /load and /save, as Ollama's.

`/load NAME` switches the chat to another stored model (or loads the current one again): the
conversation and a /set system prompt are dropped, the /set parameter values are kept, and the
new model's own MESSAGEs become the history. `/save NAME` keeps this chat as a new model, written
as `ft create` writes a Modelfile `FROM` the current model: its SYSTEM, PARAMETERs and the
messages so far as MESSAGE lines, the weights' blobs shared (nothing is copied), so that
`ft run NAME` starts where the chat was.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

from ftw import FTWError
from registry import RegistryError, Store, parse_name
from runtime.planner.placement import FitError
from runtime.text.chat_template import ChatTemplateError
from runtime.text.tokenizer import TokenizerError

from .fetch import PullError
from .modelfile import PARAMETERS, ModelfileError, parse_modelfile, variant_modelfile
from .pull import create_from

if TYPE_CHECKING:
    from .run import Chat

# what a /load or /save the user asked for can run into: said in the REPL, which goes on
MODEL_ERRORS = (RegistryError, FTWError, FitError, PullError, ModelfileError, TokenizerError, ChatTemplateError,
                ValueError, LookupError, OSError)


@dataclass(frozen=True)
class ModelLoader:
    """How this run loads a model (its store, and `ft run`'s --dtype, --num-ctx, --device and the
    rest, inside `load`), to load another the same way. `load(name, overrides)` returns a Chat."""

    store: Store
    load: Callable[[str, dict[str, Any]], Chat]


def load_model(chat: Chat, text: str) -> str:
    """/load: switch `chat` to the stored model `text`. A name outside the grammar or not stored
    is refused before anything is unloaded (with the stored names it may mean); a load that fails
    loads the previous model again, and the error is raised."""
    loader: ModelLoader | None = getattr(chat, "loader", None)
    name = parse_name(text)
    if loader is None:  # a chat through `ft serve` (serve.RemoteChat): the server loads it
        first = chat.load(name.display)  # type: ignore[attr-defined]
        return "\n".join([f"Loaded model '{name.display}'", *history_lines(first)])
    loader.store.read_manifest(name)  # ModelNotFoundError, with the stored names that look like it
    kept = {k: v for k, v in chat.options.items() if chat.model_options.get(k) != v}  # the user's /set parameter
    previous = chat.model_name
    _release(chat)
    try:
        _adopt(chat, loader.load(name.display, kept))
    except BaseException:
        if previous is not None:
            _adopt(chat, loader.load(previous, kept))
        raise
    return "\n".join([f"Loaded model '{name.display}'", *history_lines(chat.messages)])


def save_model(chat: Chat, text: str) -> str:
    """/save: register the chat as the model `text` (replacing one of that name), FROM the
    current model; InvalidNameError for a name outside the grammar."""
    loader: ModelLoader | None = getattr(chat, "loader", None)
    name = parse_name(text)
    if loader is None:  # a chat through `ft serve` (serve.RemoteChat): the server stores it
        return f"Created new model '{chat.save(name.display)}'"  # type: ignore[attr-defined]
    if chat.model_name is None:
        raise ValueError("/save needs a stored model to save FROM")
    modelfile = parse_modelfile(session_modelfile(chat), name=name.model)
    result = create_from(name, modelfile, loader.store)
    return f"Created new model '{result.name.display}'"


def session_modelfile(chat: Chat) -> str:
    """The chat as a Modelfile FROM its model: SYSTEM, PARAMETERs (the model's own with the
    chat's over them; num_ctx where the user set one), a MESSAGE per message so far."""
    options = {**chat.options, **({"num_ctx": chat.num_ctx} if chat.num_ctx is not None else {})}
    return variant_modelfile(str(chat.model_name), system=chat.system, messages=chat.messages,
                             parameters={k: v for k, v in options.items() if k in PARAMETERS})  # (not load options)


def history_lines(messages: list[dict[str, str]]) -> list[str]:
    """A model's MESSAGEs as a run shows them before its first prompt, as Ollama does."""
    out = []
    for message in messages:
        if message["role"] == "user":
            out.append(f">>> {message['content']}")
        elif message["role"] == "assistant":
            out += [message["content"], ""]
    return out


def _release(chat: Chat) -> None:
    """Let the old model's weights, KV cache and expert cache go before the next is loaded."""
    chat.session = None  # type: ignore[assignment]
    chat.experts = chat.loaded = None
    gc.collect()


def _adopt(chat: Chat, other: Chat) -> None:
    for f in fields(other):
        setattr(chat, f.name, getattr(other, f.name))
