"""`ft pull` and `ft create`: resolve, fit-check, fetch, convert, verify, register.

A pull holds the store's pull session and the model's lock from start to end, so a concurrent
pull of the same model waits and then finds it present, and gc never sees half-added blobs.
Downloads go to `$FT_HOME/downloads/...` and survive an interruption (the next pull resumes);
a pull from a repository also holds that repository's download lock, so two names of one
repository take turns with its download directory, which each deletes when done. Conversion
happens in a per-process work dir that is removed on any failure, and that the next pull
removes if the process was killed (with any temp file a killed writer left, `Store.cleanup_stale`;
`ft list` and `ft rm` run it too). The manifest is written last.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from registry import InvalidNameError, ModelName, Store, parse_name
from runtime.loading.registered import open_model

from .events import PullEvent, Report, quiet, up_to_date
from .fetch import PullError, download_key, fetch, remove_downloads
from .modelfile import Modelfile, Recipe, load_modelfile
from .register import convert_and_register, modelfile_text, register_variant
from .resolve import PullTarget, ResolveError, resolve

__all__ = ["PullError", "PullEvent", "PullResult", "create", "create_from", "install", "pull"]


@dataclass(frozen=True)
class PullResult:
    name: ModelName
    already_present: bool
    size_bytes: int


def pull(text: str, store: Store, *, force: bool = False, report: Report = quiet) -> PullResult:
    """Make the model `text` present in `store` (a fast no-op if it already is). A stored model
    whose files are missing or of the wrong size is made again where the recipe `text` names made
    it; otherwise the error says how to repair it."""
    store.cleanup_stale()  # work dirs and temp files of killed processes, also when nothing is fetched
    present = _present_name(text, store)
    if present is not None:  # any stored name, also ones no recipe makes (ft create, ft cp, local/...)
        return _kept_or_healed(store, present, lambda: _recipe_target(text), force, report)
    target = resolve(text)
    if store.has_model(target.name):
        _check_same_local_source(target, store)
        return _kept_or_healed(store, target.name, lambda: target, force, report)
    return install(target, store, force=force, report=report)


def _recipe_target(text: str) -> PullTarget | None:
    """What `text` resolves to, None where no recipe makes it (a copy's or a created model's name)."""
    try:
        return resolve(text)
    except (ResolveError, KeyError):
        return None


def _kept_or_healed(store: Store, name: ModelName, recipe_target: Callable[[], PullTarget | None], force: bool,
                    report: Report) -> PullResult:
    """The stored model `name`, up to date; or, with damaged files, pulled again where the recipe
    `text` resolves to is the one it was made from (never a same-named recipe's other model over it)."""
    damaged = _damaged_files(store, name)
    if not damaged:
        report(up_to_date(name.display))
        return PullResult(name, True, store.read_manifest(name).total_size)
    target = recipe_target()
    if target is None or target.name != name or not _made_from(store, name, target):
        raise PullError(_repair_advice(store, name, damaged))
    report(PullEvent(f"{name.display}: {_listed(damaged)} missing or damaged; pulling it again"))
    return install(target, store, force=force, heal=True, report=report)


def _made_from(store: Store, name: ModelName, target: PullTarget) -> bool:
    """Whether the stored model was made from `target`'s recipe as it is now (its stored Modelfile
    is the one that recipe writes), and is no variant: only then may a pull make it again."""
    model = open_model(store, name)
    family = model.config.get("family")
    return "variant_of" not in model.config and isinstance(family, str) \
        and model.text("Modelfile") == modelfile_text(target.recipe, family)


def _repair_advice(store: Store, name: ModelName, damaged: list[str]) -> str:
    """What to do about a damaged model no pull can make again: its files are shared with the
    model they came from, so repairing that one repairs this one."""
    config = open_model(store, name).config
    head = f"{name.display}: {_listed(damaged)} missing or damaged"
    base = config.get("variant_of")
    if isinstance(base, str):
        return (f"{head}; it is a variant of {base} and shares its files: `ft pull {base}` (or create {base} "
                f"again) repairs both; `ft verify {name.display}` checks")
    return (f"{head}, and no recipe makes this name again. Its files came from {config.get('source')}: pull or "
            "create the model made from that again (models share files: that repairs this one too), or "
            f"`ft rm {name.display}`")


def _damaged_files(store: Store, name: ModelName) -> list[str]:
    """The titles of the model's blobs that are missing, not the size its manifest says, or
    corrupt as far as the quick check a load makes sees (Store.verify without rehash; `ft verify`
    hashes everything)."""
    config = store.read_manifest(name).config.digest
    return ["the config" if bad.digest == config else bad.title for bad in store.verify(name, rehash=False)]


def _listed(titles: list[str]) -> str:
    return ", ".join(titles[:3]) + (f" and {len(titles) - 3} more" if len(titles) > 3 else "") + \
        (" is" if len(titles) == 1 else " are")


def _check_same_local_source(target: PullTarget, store: Store) -> None:
    """A local checkpoint is named after its directory: another directory of the same name
    (`.../run-a/checkpoint`, `.../run-b/checkpoint`) is a different model, not an "up to date" one."""
    source = target.recipe.source
    if source.scheme != "local":
        return
    stored = open_model(store, target.name).config.get("source")
    if stored is not None and str(stored) != source.path:
        raise PullError(
            f"{target.name.display} already holds the model pulled from {stored}, not {source.path}; remove it "
            f"(`ft rm {target.name.display}`) or import this one under its own name: a Modelfile with "
            f"`FROM {source.path}` and `ft create NAME -f Modelfile`")


def _present_name(text: str, store: Store) -> ModelName | None:
    try:
        name = parse_name(text)
    except InvalidNameError:
        return None  # a path or an hf:// URI: resolve() decides
    return name if store.has_model(name) else None


def create(name: str, modelfile_path: Path, store: Store, *, tag: str | None = None, report: Report = quiet) -> PullResult:
    """`ft create NAME -f Modelfile`: build NAME from a Modelfile (replacing an existing NAME). A
    FROM naming a stored model, where no directory of that name exists, makes NAME a variant of it
    (Ollama's `FROM MODEL`): its weights shared, its recipe's fields changed where stated."""
    model_name = parse_name(name)  # (a bad name is refused before the Modelfile is read)
    return create_from(model_name, load_modelfile(modelfile_path), store, tag=tag, report=report)


def create_from(model_name: ModelName, modelfile: Modelfile, store: Store, *, tag: str | None = None,
                report: Report = quiet) -> PullResult:
    """`create` from a parsed Modelfile (the REPL's /save writes one from its chat)."""
    store.cleanup_stale()
    recipe = replace(modelfile.recipe(tag), name=model_name.model, tag=model_name.tag)
    target = PullTarget(model_name, recipe)
    base = _stored_base(recipe, store)
    if base is None:
        return install(target, store, replace_existing=True, report=report)
    damaged = _damaged_files(store, base)
    if damaged:
        raise PullError(f"{recipe.ref}: FROM {base.display}, whose {_listed(damaged)} missing or damaged; "
                        f"`ft pull {base.display}` first (`ft verify {base.display}` checks)")
    try:
        with store.pull_session(timeout_s=None), store.lock(model_name, timeout_s=None):
            manifest = register_variant(target, store, base, report)
    finally:
        store.gc(wait=False)  # the weights of a model NAME held before, if no other model names them
    report(PullEvent("success"))
    return PullResult(model_name, False, manifest.total_size)


def _stored_base(recipe: Recipe, store: Store) -> ModelName | None:
    """The stored model a recipe's FROM names, where it names no directory (None otherwise)."""
    source = recipe.source
    if source.scheme != "local" or source.model_name is None or os.path.exists(source.path or ""):
        return None
    base = parse_name(source.model_name)
    if not store.has_model(base):
        raise PullError(f"{recipe.ref}: FROM {source.model_name} is neither a directory ({source.path}) nor a stored "
                        f"model; pull it first (`ft pull {source.model_name}`), or give the checkpoint's path")
    return base


def install(
    target: PullTarget, store: Store, *, force: bool = False, replace_existing: bool = False, heal: bool = False,
    report: Report = quiet
) -> PullResult:
    """Fetch, convert and register `target` under the store's locks (see the module docstring).
    `heal`: the stored model has damaged files; made again unless another pull did it meanwhile."""
    store.cleanup_stale()  # (pull and create ran it already; install is called on its own too, and it is cheap)
    # blobs no model names: of a pull killed while it registered, or of models removed while
    # another pull ran (their gc was skipped then); before the fit check counts them as used
    store.gc(wait=False)
    repo = target.recipe.source.repo_id
    try:
        with store.pull_session(timeout_s=None), store.lock(target.name, timeout_s=None), \
                store.temp_dir("pull") as work, \
                store.download_lock(download_key(repo)) if repo else contextlib.nullcontext():  # (its files: from download to delete)
            if store.has_model(target.name) and not replace_existing \
                    and not (heal and _damaged_files(store, target.name)):  # another process pulled it while we waited
                report(up_to_date(target.name.display))
                return PullResult(target.name, True, store.read_manifest(target.name).total_size)
            fetched = fetch(target, store, work, force, report)
            manifest = convert_and_register(target, store, fetched, work, report)
            if repo is not None:
                remove_downloads(store, repo, fetched)  # no longer needed
    finally:
        # blobs of a replaced model, of one removed while this pull ran, or of this pull if it
        # failed after moving some in: whatever no manifest names (skipped while others pull)
        store.gc(wait=False)
    report(PullEvent("success"))
    return PullResult(target.name, False, manifest.total_size)
