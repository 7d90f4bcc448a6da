"""The store as the server sees it: model lookup, listing, `show` details, delete/copy, and the split
of a request's `options` into sampling parameters and load options.

Plain functions over a `registry.Store`; the model manager (backend.py) adds loading and queueing.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from registry import InvalidNameError, ModelNotFoundError, RegistryError, Store
from runtime.loading.registered import MEDIA_TEMPLATE, RegisteredModel, open_model
from runtime.text.sampling import OPTION_ALIASES, InvalidParameterError, SamplingParams

from .protocol import BadRequest, ModelInfo, ModelNotFound, ServerError

log = logging.getLogger(__name__)

# Ollama options that size or place the model rather than steer sampling (num_ctx, num_thread are
# honoured at load; the rest have no meaning for this runtime) and llama.cpp samplers ft does not
# implement. Clients such as the `ollama` package send them verbatim, so they are accepted and ignored.
LOAD_OPTIONS = ("num_ctx", "num_thread")
IGNORED_OPTIONS = frozenset({
    "numa", "num_batch", "num_gpu", "main_gpu", "low_vram", "f16_kv", "logits_all", "vocab_only", "use_mmap",
    "use_mlock", "embedding_only", "num_keep", "tfs_z", "typical_p", "mirostat", "mirostat_tau", "mirostat_eta",
    "penalize_newline",
})
MAX_NUM_THREAD = os.cpu_count() or 1  # more threads than CPUs only slows the kernels down: asked for, they are cut to it


@dataclass(frozen=True)
class RequestOptions:
    """A request's `options` over the model's recipe PARAMETERs, split by what they control."""

    sampling: SamplingParams
    num_ctx: int | None = None  # the request's own (planned exactly or refused); the recipe's is the load's default
    num_thread: int | None = None


def _positive_int(name: str, value: Any, limit: int) -> int:
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= limit:
        raise BadRequest(f"invalid option {name}={value!r}: must be an integer in [1, {limit}]")
    return value


def request_options(model: RegisteredModel, options: Mapping[str, Any] | None) -> RequestOptions:
    """Sampling and load options of one request; BadRequest naming the option when one is invalid."""
    if options is not None and not isinstance(options, Mapping):
        raise BadRequest(f"options must be an object of option names to values, not {type(options).__name__}")
    given = {k: v for k, v in (options or {}).items() if v is not None}
    if not all(isinstance(k, str) for k in given):
        raise BadRequest("option names must be strings")
    # the request's value overrides the recipe's under any name of the option (a Modelfile's
    # num_predict against OpenAI's max_tokens is no conflict)
    asked = {OPTION_ALIASES.get(k, k) for k in given}
    recipe = {k: v for k, v in (model.config.get("parameters") or {}).items()
              if OPTION_ALIASES.get(k, k) not in asked}
    merged = {**recipe, **given}
    load = {k: merged.pop(k) for k in LOAD_OPTIONS if k in merged}
    for name in IGNORED_OPTIONS & merged.keys():
        log.debug("ignoring option %s=%r: ft has no such setting", name, merged.pop(name))
    try:
        sampling = SamplingParams.from_options(merged)
    except InvalidParameterError as e:
        raise BadRequest(str(e)) from None
    num_ctx = load.get("num_ctx") if "num_ctx" in given else None  # (the recipe's: backend._asked_ctx)
    num_thread = load.get("num_thread")
    return RequestOptions(
        sampling,
        num_ctx=None if num_ctx is None else _positive_int("num_ctx", num_ctx, 1 << 24),
        num_thread=None if num_thread is None else min(_positive_int("num_thread", num_thread, 1 << 16), MAX_NUM_THREAD),
    )


def sets_max_tokens(model: RegisteredModel, options: Mapping[str, Any] | None) -> bool:
    """Whether the request or the model's recipe gives max_tokens under any of its names, "no
    limit" (-1, num_predict -2) included."""
    given = {k for k, v in (options or {}).items() if v is not None} | set(model.config.get("parameters") or {})
    return any(OPTION_ALIASES.get(k, k) == "max_tokens" for k in given if isinstance(k, str))


def _trimmed(name: str) -> str:
    """`name` without surrounding ASCII blanks (a pasted newline); str.strip() would also drop
    Unicode spaces and separators, and a name is checked as the client typed it (registry.names)."""
    return name.strip(" \t\r\n")


def lookup(store: Store, name: str) -> RegisteredModel:
    """The registered model `name`; ModelNotFound (404) or BadRequest (an invalid name)."""
    if not isinstance(name, str) or not _trimmed(name):
        raise BadRequest("model is required: give the name of a model (see /api/tags)")
    try:
        return open_model(store, _trimmed(name))
    except InvalidNameError as e:
        raise BadRequest(str(e)) from None
    except ModelNotFoundError:
        raise ModelNotFound(f"model {name!r} not found; pull it first (ft pull {name})") from None
    except RegistryError as e:
        raise ServerError(str(e)) from None


def digest_of(model: RegisteredModel) -> str:
    """Ollama's model digest: the sha256 of the manifest (hex, no prefix)."""
    return model.manifest.digest_hex


def model_info(model: RegisteredModel, modified_at: float) -> ModelInfo:
    c = model.config
    return ModelInfo(
        name=model.name.display, digest=digest_of(model), size_bytes=model.manifest.total_size,
        modified_at=modified_at, family=c.get("family"), dtype=c.get("dtype"),
        parameters=c.get("num_params_total"), context_length=c.get("context_length"))


def list_models(store: Store) -> list[ModelInfo]:
    """Every readable model of the store, by name."""
    out = []
    for entry in store.list_models():
        try:
            out.append(model_info(open_model(store, entry.name), entry.modified_time))
        except RegistryError as e:  # removed or damaged between the scan and the read
            log.warning("skipping %s: %s", entry.name.display, e)
    return out


def modified_at(store: Store, model: RegisteredModel) -> float:
    try:
        return store.manifest_path(model.name).stat().st_mtime
    except OSError:
        return 0.0


def template_of(model: RegisteredModel) -> str | None:
    """The chat template the tokenizer will use: a Modelfile TEMPLATE, else the checkpoint's."""
    custom = next((d.title for d in model.manifest.layers if d.media_type == MEDIA_TEMPLATE), None)
    if custom is not None:
        return model.text(custom)
    if model.file("chat_template.jinja"):
        return model.text("chat_template.jinja")
    try:
        config = json.loads(model.text("tokenizer_config.json") or "{}")
    except (ValueError, RecursionError):
        return None
    template = config.get("chat_template") if isinstance(config, dict) else None
    if isinstance(template, list):  # named templates: the default one
        template = next((t.get("template") for t in template if isinstance(t, dict) and t.get("name") == "default"), None)
    return template if isinstance(template, str) else None


def capabilities(template: str | None) -> list[str]:
    """What a client may ask of the model, read from its chat template as Ollama does."""
    caps = ["completion"]
    if template and "tools" in template:
        caps.append("tools")
    if template and "think" in template:
        caps.append("thinking")
    return caps


def show(store: Store, name: str) -> dict[str, Any]:
    """What /api/show reports, as plain data (the flavour formats it)."""
    model = lookup(store, name)
    c = model.config
    template = template_of(model)
    return {
        "name": model.name.display,
        "digest": digest_of(model),
        "modified_at": modified_at(store, model),
        "size": model.manifest.total_size,
        "config": c,
        "parameters": c.get("parameters") or {},
        "system": c.get("system"),
        "template": template,
        "modelfile": model.text("Modelfile") or "",
        "license": c.get("license") or model.text("LICENSE"),  # (the recipe's LICENSE, kept in the config at pull)
        "capabilities": capabilities(template),
        "messages": [{"role": m["role"], "content": m["content"]} for m in c.get("messages") or ()
                     if isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)],
    }


def delete(store: Store, name: str) -> None:
    lookup(store, name)  # 404 / 400 with the same messages as everywhere
    try:
        store.remove(_trimmed(name))
    except ModelNotFoundError:
        raise ModelNotFound(f"model {name!r} not found") from None
    except RegistryError as e:
        raise ServerError(str(e)) from None


def copy(store: Store, source: str, destination: str) -> None:
    lookup(store, source)
    if not isinstance(destination, str) or not _trimmed(destination):
        raise BadRequest("destination is required: the new model name")
    try:
        store.copy(_trimmed(source), _trimmed(destination))
    except InvalidNameError as e:
        raise BadRequest(str(e)) from None
    except ModelNotFoundError:
        raise ModelNotFound(f"model {source!r} not found") from None
    except RegistryError as e:
        raise ServerError(str(e)) from None
