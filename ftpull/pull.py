"""`ft pull`: resolve, fit-check, download, convert, verify, register — crash-safe at every step.

A pull holds the store's pull session and the model's lock from start to end, so a concurrent
pull of the same model waits and then finds it present, and gc never sees half-added blobs.
Downloads go to `$FT_HOME/downloads/...` and survive an interruption (the next pull resumes);
conversion happens in a per-process work dir that is removed on any failure, and that the next
pull removes if the process was killed. The manifest is written last.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from ftw import INDEX_FILENAME, Index, convert_checkpoint, family_for_config, load_config
from registry import ANNOTATION_TITLE, Descriptor, Manifest, ModelName, Store, parse_name
from runtime.weights import (
    MEDIA_CONFIG,
    MEDIA_FILE,
    MEDIA_FTW_INDEX,
    MEDIA_FTW_SHARD,
    MEDIA_MODELFILE,
    MEDIA_TEMPLATE,
)

from . import hub
from .modelfile import DEFAULT_TAG, Modelfile, Recipe, load_modelfile
from .preflight import Footprint, Resources, footprint, refuse_unless_fits
from .resolve import FAMILY_FROM_CONFIG, PullTarget, resolve

SIDE_FILES = hub.AUX_FILES[1:]  # everything but config.json, which lives in the FTW index


@dataclass(frozen=True)
class PullEvent:
    """Progress, shaped like Ollama's /api/pull stream: a status line and optional byte counts."""

    status: str
    total: int | None = None
    completed: int | None = None


@dataclass(frozen=True)
class PullResult:
    name: ModelName
    already_present: bool
    size_bytes: int


Report = Callable[[PullEvent], None]


def _quiet(event: PullEvent) -> None:
    pass


class PullError(Exception):
    """A pull could not complete; the message says why and what to do."""


def pull(text: str, store: Store, *, force: bool = False, report: Report = _quiet) -> PullResult:
    """Make the model `text` present in `store` (a fast no-op if it already is)."""
    target = resolve(text)
    if store.has_model(target.name):
        report(PullEvent(f"{target.name.display} is up to date"))
        return PullResult(target.name, True, store.read_manifest(target.name).total_size)
    return install(target, store, force=force, report=report)


def create(name: str, modelfile_path: Path, store: Store, *, tag: str | None = None, report: Report = _quiet) -> PullResult:
    """`ft create NAME -f Modelfile`: build NAME from a Modelfile (replacing an existing NAME)."""
    modelfile = load_modelfile(modelfile_path)
    model_name = parse_name(name)
    recipe = replace(modelfile.recipe(tag), name=model_name.model, tag=model_name.tag)
    return install(PullTarget(model_name, recipe), store, replace_existing=True, report=report)


def install(
    target: PullTarget, store: Store, *, force: bool = False, replace_existing: bool = False, report: Report = _quiet
) -> PullResult:
    """Fetch, convert and register `target` under the store's locks (see the module docstring)."""
    store.cleanup_stale()
    with store.pull_session(timeout_s=None), store.lock(target.name, timeout_s=None), store.temp_dir("pull") as work:
        if store.has_model(target.name) and not replace_existing:  # another process pulled it while we waited
            report(PullEvent(f"{target.name.display} is up to date"))
            return PullResult(target.name, True, store.read_manifest(target.name).total_size)
        checkpoint_dir = _fetch(target, store, work, force, report)
        manifest = _convert_and_register(target, store, checkpoint_dir, work, report)
        if target.recipe.source.scheme == "hf":
            shutil.rmtree(checkpoint_dir, ignore_errors=True)  # the download is no longer needed
    if replace_existing:
        store.gc(wait=False)  # blobs of a replaced model
    report(PullEvent("success"))
    return PullResult(target.name, False, manifest.total_size)


def _fetch(target: PullTarget, store: Store, work: Path, force: bool, report: Report) -> Path:
    """The checkpoint directory to convert: downloaded, built, or the user's own."""
    source = target.recipe.source
    if source.scheme == "local":
        path = Path(source.path or "")
        if not (path / "config.json").is_file():
            raise PullError(f"{path} is not a Hugging Face checkpoint directory (no config.json)")
        _check_family(target.recipe, load_config(path))
        return path
    if source.scheme == "builtin":
        if source.path != "tiny":
            raise PullError(f"unknown builtin model {source.path!r} (ft ships builtin://tiny)")
        from .tiny import build_tiny_checkpoint

        report(PullEvent("building the tiny model locally"))
        return build_tiny_checkpoint(work / "builtin")
    if source.scheme == "gguf":
        raise PullError(f"{target.name.display}: GGUF sources ({source.uri()}) are not supported by this ft yet")
    assert source.repo_id is not None
    report(PullEvent(f"pulling manifest of {source.repo_id}"))
    remote = hub.fetch_checkpoint_info(source.repo_id, source.revision)
    family = _check_family(target.recipe, remote.config)
    download_dir = store.root / "downloads" / "hf" / source.repo_id / remote.revision
    present = sum((download_dir / f.name).stat().st_size for f in remote.files if (download_dir / f.name).is_file())
    config = family.text_config(remote.config)
    fp: Footprint = footprint(family, int(config.get("num_hidden_layers", 0)), remote.tensors,
                              remote.download_bytes, target.recipe.dtype)
    refuse_unless_fits(target.name.display, fp, Resources.probe(store.disk_free_bytes()), force=force,
                       already_downloaded_bytes=present)
    download_dir.mkdir(parents=True, exist_ok=True)
    counter = _Counter(report, f"pulling {source.repo_id}", remote.download_bytes)
    hub.download_files(source.repo_id, remote.revision, remote.files, download_dir, on_progress=counter.at)
    return download_dir


def _check_family(recipe: Recipe, config: dict):
    """The checkpoint's family, refusing a checkpoint that is not what the recipe says."""
    family = family_for_config(config)  # unknown architectures are refused here, before downloading
    if recipe.family not in (FAMILY_FROM_CONFIG, family.name) and recipe.family not in family.model_types:
        raise PullError(
            f"{recipe.ref}: the recipe says family {recipe.family!r} but the checkpoint is {config.get('model_type')!r}; "
            "fix FAMILY in the Modelfile"
        )
    return family


def _convert_and_register(target: PullTarget, store: Store, checkpoint: Path, work: Path, report: Report) -> Manifest:
    recipe = target.recipe
    out = work / "ftw"
    total = sum(p.stat().st_size for p in checkpoint.glob("*.safetensors"))
    progress = _Counter(report, "converting to FTW", total)
    index = convert_checkpoint(checkpoint, out, dtype=recipe.dtype, progress=progress)
    report(PullEvent("verifying sha256 digests"))
    layers = [_add(store, out / s.name, MEDIA_FTW_SHARD, s.name, "sha256:" + s.sha256) for s in index.shards]
    layers.insert(0, _add(store, out / INDEX_FILENAME, MEDIA_FTW_INDEX, INDEX_FILENAME))
    for name in SIDE_FILES:
        if (checkpoint / name).is_file():
            shutil.copyfile(checkpoint / name, work / name)  # the download dir keeps its copy until success
            layers.append(_add(store, work / name, MEDIA_FILE, name))
    modelfile = _modelfile_text(recipe, index.family)
    layers.append(_add_bytes(store, modelfile.encode(), MEDIA_MODELFILE, "Modelfile"))
    if recipe.template and recipe.template != "checkpoint":
        layers.append(_add_bytes(store, recipe.template.encode(), MEDIA_TEMPLATE, "template.jinja"))
    config = _summary(recipe, index, checkpoint)
    config_ref = store.add_blob_bytes(json.dumps(config, indent=1, sort_keys=True).encode())
    manifest = Manifest(config=config_ref.descriptor(MEDIA_CONFIG), layers=layers)
    report(PullEvent("writing manifest"))
    store.write_manifest(target.name, manifest)
    return manifest


def _add(store: Store, path: Path, media_type: str, title: str, digest: str | None = None) -> Descriptor:
    return store.add_blob_file(path, digest=digest).descriptor(media_type, {ANNOTATION_TITLE: title})


def _add_bytes(store: Store, data: bytes, media_type: str, title: str) -> Descriptor:
    return store.add_blob_bytes(data).descriptor(media_type, {ANNOTATION_TITLE: title})


def _modelfile_text(recipe: Recipe, family: str) -> str:
    """The recipe as canonical Modelfile text, stored with the model so `ft show` can print it."""
    single = replace(recipe, tag=DEFAULT_TAG, family=family)
    return Modelfile(path=None, default=single, tags={DEFAULT_TAG: single}).to_text()


def _summary(recipe: Recipe, index: Index, checkpoint: Path) -> dict:
    """The manifest's config blob: what `ft list` and `ft show` print without opening the index."""
    c = index.config
    keys = ("family", "model_type", "dtype", "num_layers", "hidden_size", "vocab_size", "num_experts",
            "num_experts_per_tok", "num_shared_experts", "moe_intermediate_size", "context_length",
            "num_params_total", "num_params_active")
    summary = {k: c.get(k) for k in keys}
    summary.update(format="ftw", ftw_version=index.version, source=recipe.source.uri(),
                   description=recipe.description, parameters=dict(recipe.parameters),
                   context_length=recipe.context_length or c.get("context_length"))
    commit = checkpoint.name if recipe.source.scheme == "hf" else None
    if commit:
        summary["revision"] = commit
    return summary


class _Counter:
    """Turns byte counts (download, conversion) into PullEvents, at most one per 0.1%."""

    def __init__(self, report: Report, status: str, total: int) -> None:
        self.report, self.status, self.total, self.done, self.last = report, status, total, 0, -1

    def __call__(self, n: int) -> None:
        self.at(self.done + n)

    def at(self, done: int) -> None:
        self.done = done
        step = self.done * 1000 // max(1, self.total)
        if step != self.last:
            self.last = step
            self.report(PullEvent(self.status, self.total, min(self.done, self.total)))
