"""From what the user typed to what to pull: a registry name and a recipe.

    qwen3.6-35b, qwen3.6-35b:fp8     a shipped Modelfile (Modelfiles/), by name and tag
    hf://Qwen/Qwen3-30B-A3B[@rev]    any Hugging Face repository, family read from its config
    hf.co/Qwen/Qwen3-30B-A3B[:tag]   the same, written as a registry name
    ./path/to/checkpoint             a local Hugging Face checkpoint directory
    ./model-Q4_K_M.gguf              a local GGUF file (the first part of a split one)
"""

from __future__ import annotations

import difflib
import os
import re
from dataclasses import dataclass
from pathlib import Path

from ftw import FAMILIES
from registry import InvalidNameError, ModelName, parse_name
from registry.names import DEFAULT_HOST, DEFAULT_NAMESPACE, DEFAULT_TAG, refuse_control_characters

from .modelfile import FAMILY_FROM_CONFIG, Recipe, Source, builtin_modelfiles, load_modelfile, parse_source

HF_HOST = "hf.co"
_TAG_SAFE = re.compile(r"[^a-z0-9._-]+")


class ResolveError(ValueError):
    """The name matches nothing pullable; the message lists what would."""


@dataclass(frozen=True)
class PullTarget:
    name: ModelName  # where the model is registered
    recipe: Recipe


def _registry_name(namespace: str, model: str, tag: str = DEFAULT_TAG, host: str = DEFAULT_HOST) -> ModelName:
    return parse_name(f"{host}/{namespace.lower()}/{model.lower()}:{tag}")


def _hf_target(source: Source, tag: str | None = None) -> PullTarget:
    assert source.repo_id is not None
    org, repo = source.repo_id.split("/")
    tag = tag or (_TAG_SAFE.sub("-", source.revision.lower()).strip("-.") if source.revision else DEFAULT_TAG)
    name = _registry_name(org, repo, tag, host=HF_HOST)
    recipe = Recipe(name=name.model, tag=name.tag, source=source, family=FAMILY_FROM_CONFIG, template="checkpoint")
    return PullTarget(name, recipe)


def _looks_like_path(text: str) -> bool:
    return text.startswith(("/", "./", "../", "~")) or os.path.isdir(text) or text.lower().endswith(".gguf")


def not_a_checkpoint(path: Path) -> str:
    """Why a local path that is no .gguf file and holds no config.json cannot be pulled."""
    if not path.exists():
        return f"{path} does not exist: give a Hugging Face checkpoint directory or a .gguf file"
    if path.is_file() and path.name == "config.json":
        return f"{path} is a checkpoint's config file: give its directory, {path.parent}"
    return f"{path} is neither a Hugging Face checkpoint directory (no config.json) nor a .gguf file"


def resolve(text: str) -> PullTarget:
    """Resolve a model reference; ResolveError (with suggestions) or InvalidNameError when it cannot."""
    text = text.strip(" \t\r\n")  # (not str.strip(): Unicode spaces are no blanks to drop, the name check sees them)
    refuse_control_characters(text)  # before a NUL reaches a path: os calls raise ValueError on one
    if not text:
        raise ResolveError("no model name given (try `ft pull tiny`, or `ft list` for local models)")
    if text.startswith("hf://"):
        try:
            source = parse_source(text)
        except ValueError as e:
            raise ResolveError(f"{e}; an address is hf://org/name or hf://org/name@revision (a tag goes with "
                               "hf.co/org/name:TAG)") from None
        return _hf_target(source)
    if _looks_like_path(text):
        path = Path(os.path.expanduser(text)).resolve()
        is_gguf = path.is_file() and path.suffix.lower() == ".gguf"
        if not is_gguf and not (path / "config.json").is_file():
            raise ResolveError(not_a_checkpoint(path))
        stem = path.stem if is_gguf else path.name
        name = _registry_name("local", _TAG_SAFE.sub("-", stem.lower()).strip("-.") or "model")
        recipe = Recipe(name=name.model, tag=name.tag, source=Source("local", path=str(path)),
                        family=FAMILY_FROM_CONFIG, template="checkpoint")
        return PullTarget(name, recipe)
    name = parse_name(text)
    if name.host == HF_HOST:  # the repository as typed: a mirror may match its id case-sensitively
        repo = text.split("/", 1)[1].rsplit(":", 1)[0] if text.count("/") == 2 else f"{name.namespace}/{name.model}"
        return _hf_target(parse_source(f"hf://{repo}"), None if name.tag == DEFAULT_TAG else name.tag)
    if name.host != DEFAULT_HOST or name.namespace != DEFAULT_NAMESPACE:
        raise InvalidNameError(f"{text!r}: ft pulls shipped models (e.g. qwen3.6-35b:fp8), hf://org/repo, or a local path")
    recipes = builtin_modelfiles()
    if name.model not in recipes:
        close = difflib.get_close_matches(name.model, list(recipes), n=3, cutoff=0.5)
        hint = f"did you mean {', '.join(close)}? " if close else ""
        raise ResolveError(
            f"no model named {name.model!r}; {hint}shipped models: {', '.join(sorted(recipes))} "
            "(or pull any Hugging Face repository as hf://org/repo)"
        )
    recipe = load_modelfile(recipes[name.model]).recipe(name.tag)
    _check_convertible(name.model, recipe)
    return PullTarget(name, recipe)


def _check_convertible(model: str, recipe: Recipe) -> None:
    """A shipped recipe of a family the converter does not know yet is refused here, before any
    network step (it cost `ft pull deepseek-v4-flash` 19 s to learn this from the Hub)."""
    if recipe.family == FAMILY_FROM_CONFIG or recipe.family == "tiny":
        return
    known = {n for f in FAMILIES.values() for n in (f.name, *f.model_types, *f.wrapper_model_types)}
    if recipe.family not in known:
        raise ResolveError(
            f"{model}: its family {recipe.family!r} cannot be converted yet; the recipe ships for when it can. "
            f"ft converts {', '.join(sorted(FAMILIES))} (`ft list` shows what is pulled)")
