"""Getting a recipe's source onto the disk: downloaded, built, or the user's own files.

Every remote source is fit-checked from metadata before its weights are downloaded.
Downloads land in `$FT_HOME/downloads/...` so an interrupted pull resumes there.
"""

from __future__ import annotations

import contextlib
import re
import shutil
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

from ftw import family_for_config, load_config
from ftw.errors import UnsupportedArchitectureError
from ftw.families import Family, normalized_config
from ftw.gguf_file import architecture_in_prefix
from ftw.gguf_source import ARCHITECTURES as GGUF_ARCHITECTURES
from ftw.safetensors_source import SafetensorsCheckpoint
from registry import DEFAULT_TAG, Store

from . import hub
from .events import ByteCounter, PullEvent, Report
from .modelfile import Recipe, Source
from .preflight import Footprint, Resources, footprint, refuse_unless_fits
from .resolve import FAMILY_FROM_CONFIG, HF_HOST, PullTarget, not_a_checkpoint

SPLIT_GGUF = re.compile(r"^(?P<stem>.+)-(?P<part>\d{5})-of-(?P<count>\d{5})\.gguf$")


class PullError(Exception):
    """A pull could not complete; the message says why and what to do."""


@dataclass(frozen=True)
class Fetched:
    """A source ready to convert: a safetensors checkpoint directory or a (first) GGUF file."""

    path: Path
    format: Literal["safetensors", "gguf"]
    revision: str | None = None  # the Hub commit, for remote sources
    download_dir: Path | None = None  # where the files below were downloaded
    downloaded: tuple[str, ...] = ()  # removed once the model is registered (remove_downloads)


def fetch(target: PullTarget, store: Store, work: Path, force: bool, report: Report) -> Fetched:
    source = target.recipe.source
    if source.scheme == "builtin":
        if source.path != "tiny":
            raise PullError(f"unknown builtin model {source.path!r} (ft ships builtin://tiny)")
        from .tiny import build_tiny_checkpoint

        report(PullEvent("building the tiny model locally"))
        checkpoint = build_tiny_checkpoint(work / "builtin")
        check_family(target.recipe, load_config(checkpoint))  # a Modelfile's FAMILY, as for any checkpoint
        return Fetched(checkpoint, "safetensors")
    if source.scheme == "local":
        return _local(target, Path(source.path or ""), store, force)
    assert source.repo_id is not None
    if source.scheme == "hf" and target.name.host == HF_HOST and target.name.tag != DEFAULT_TAG:
        quant = _gguf_for_tag(source, target.name.tag)  # hf.co/org/repo:Q4_K_M, as Ollama reads it
        if quant is not None:
            gguf = Source("gguf", repo_id=source.repo_id, path=quant, revision=source.revision)
            target = replace(target, recipe=replace(target.recipe, source=gguf))
    if target.recipe.source.scheme == "gguf":
        return _remote_gguf(target, store, force, report)
    return _remote_safetensors(target, store, force, report)


def _gguf_for_tag(source: Source, tag: str) -> str | None:
    """The repository's .gguf file whose name holds `tag` as a whole word (`...-Q4_K_M.gguf`, the
    first part of a split one), None where no file is named so and the repository holds a
    Transformers checkpoint (the tag then only names the local copy); PullError where the
    repository is GGUF only, or where several files match, with the quants it has."""
    assert source.repo_id is not None
    revision, sizes = hub.fetch_file_sizes(source.repo_id, source.revision)
    models = {}  # each GGUF model's (first) file -> its name without the split suffix
    for name in sorted(n for n in sizes if n.lower().endswith(".gguf")):
        split = SPLIT_GGUF.match(Path(name).name)
        if split is None or split["part"] == "00001":
            models[name] = split["stem"] if split else Path(name).stem
    word = re.compile(rf"(?:^|[-_.]){re.escape(tag.lower())}(?:[-_.]|$)")
    matches = [name for name, stem in models.items() if word.search(stem.lower())]
    if len(matches) == 1:
        return matches[0]
    if len(matches) > 1:
        raise PullError(f"{source.repo_id} has several .gguf files for {tag!r}: {', '.join(matches)}; pull one as "
                        f"gguf://{source.repo_id}/FILE")
    if models and "config.json" not in sizes:
        raise PullError(f"{source.repo_id}@{revision[:12]} has no .gguf file for {tag!r}; it has "
                        + ", ".join(Path(name).name for name in models))
    return None


def check_family(recipe: Recipe, config: dict[str, Any]) -> Family:
    """The checkpoint's family, refusing a checkpoint that is not what the recipe says."""
    family = family_for_config(config)  # unknown architectures are refused here, before downloading
    if recipe.family not in (FAMILY_FROM_CONFIG, family.name, *family.model_types, *family.wrapper_model_types):
        raise PullError(
            f"{recipe.ref}: the recipe says family {recipe.family!r} but the checkpoint is {config.get('model_type')!r}; "
            "fix FAMILY in the Modelfile"
        )
    return family


def _fit(target: PullTarget, store: Store, fp: Footprint, force: bool) -> None:
    refuse_unless_fits(target.name.display, fp, Resources.probe(store.disk_free_bytes()), force=force)


def _safetensors_footprint(target: PullTarget, family: Family, config: dict[str, Any],
                           tensors: dict[str, tuple[str, int]], download_bytes: int) -> Footprint:
    num_layers = normalized_config(family, config)["num_layers"]  # (every size checked, before any download)
    return footprint(family, num_layers, tensors, download_bytes, target.recipe.dtype)


def _local(target: PullTarget, path: Path, store: Store, force: bool) -> Fetched:
    if path.is_file() and path.suffix.lower() == ".gguf":
        size = sum(p.stat().st_size for p in gguf_parts(path))
        _fit(target, store, Footprint(download_bytes=0, expert_bytes=size, dense_bytes=0), force)
        return Fetched(path, "gguf")
    if not (path / "config.json").is_file():  # (gone since it was resolved)
        raise PullError(not_a_checkpoint(path))
    config = load_config(path)
    family = check_family(target.recipe, config)
    with SafetensorsCheckpoint(path) as ckpt:
        tensors = {name: (t.dtype, t.nbytes) for name, t in ckpt.tensors.items()}
    _fit(target, store, _safetensors_footprint(target, family, config, tensors, 0), force)
    return Fetched(path, "safetensors")


def gguf_parts(path: Path) -> list[Path]:
    """All files of a (possibly split: NAME-00001-of-00003.gguf) GGUF model."""
    m = SPLIT_GGUF.match(path.name)
    if not m:
        return [path]
    return [path.with_name(f"{m['stem']}-{k:05d}-of-{m['count']}.gguf") for k in range(1, int(m["count"]) + 1)]


def download_key(repo_id: str) -> str:
    """The repository a download belongs to, as its directory and its lock name it: the Hub
    matches repository ids whatever their case, so Org/Model and org/model share both."""
    return repo_id.lower()


def downloads_of(store: Store, repo_id: str) -> Path:
    """Where a repository's files download to (one directory per `download_key`)."""
    return store.root / "downloads" / "hf" / download_key(repo_id)


def remove_downloads(store: Store, repo_id: str, fetched: Fetched) -> None:
    """After a pull: its downloaded files, and the repository's other commits' directories (an
    interrupted pull's files of a commit the repository has moved past). Other files of this
    commit stay: another quant's interrupted download, still to resume."""
    root = downloads_of(store, repo_id)
    here = fetched.download_dir
    for name in fetched.downloaded if here is not None else ():
        for path in (here / name, here / (name + hub.PARTIAL_SUFFIX)):
            path.unlink(missing_ok=True)
    if root.is_dir():
        for other in root.iterdir():
            if other != here:
                shutil.rmtree(other, ignore_errors=True)
    if here is None or not here.is_dir():
        return
    for folder in sorted((d for d in here.rglob("*") if d.is_dir()), key=lambda d: len(d.parts), reverse=True):
        with contextlib.suppress(OSError):  # folders the pulled files came in, once empty
            folder.rmdir()
    folder, top = here, store.root / "downloads"
    while folder != top and top in folder.parents:
        try:
            folder.rmdir()
        except OSError:  # not empty: another quant's download stays
            return
        folder = folder.parent


def _download(target: PullTarget, store: Store, revision: str, files: tuple[hub.RemoteFile, ...], report: Report) -> Path:
    source = target.recipe.source
    assert source.repo_id is not None
    download_dir = downloads_of(store, source.repo_id) / revision
    download_dir.mkdir(parents=True, exist_ok=True)
    counter = ByteCounter(report, f"pulling {source.repo_id}", sum(f.size for f in files))
    hub.download_files(source.repo_id, revision, files, download_dir, on_progress=counter.at)
    return download_dir


def _remaining(store: Store, repo_id: str, revision: str, files: tuple[hub.RemoteFile, ...]) -> int:
    """Bytes still to download: a finished file's and an interrupted one's (`.part`) are on disk."""
    download_dir = downloads_of(store, repo_id) / revision
    present = 0
    for f in files:
        for path in (download_dir / f.name, download_dir / (f.name + hub.PARTIAL_SUFFIX)):
            if path.is_file():
                present += min(path.stat().st_size, f.size)
                break
    return max(0, sum(f.size for f in files) - present)


def _remote_safetensors(target: PullTarget, store: Store, force: bool, report: Report) -> Fetched:
    source = target.recipe.source
    assert source.repo_id is not None
    report(PullEvent(f"pulling manifest of {source.repo_id}"))
    remote = hub.fetch_checkpoint_info(source.repo_id, source.revision)
    family = check_family(target.recipe, remote.config)
    remaining = _remaining(store, source.repo_id, remote.revision, remote.files)
    _fit(target, store, _safetensors_footprint(target, family, remote.config, remote.tensors, remaining), force)
    download_dir = _download(target, store, remote.revision, remote.files, report)
    return Fetched(download_dir, "safetensors", remote.revision, download_dir, tuple(f.name for f in remote.files))


GGUF_PREFIX_BYTES = 1 << 20  # general.architecture comes first in llama.cpp's files


def _check_gguf_architecture(repo_id: str, revision: str, name: str) -> None:
    """Refuse a GGUF of an architecture ft cannot convert before its download (a 20 GB file was
    downloaded, then refused, and left in downloads/)."""
    arch = architecture_in_prefix(hub.read_prefix(repo_id, revision, name, GGUF_PREFIX_BYTES), f"{repo_id}/{name}")
    if arch is not None and arch not in GGUF_ARCHITECTURES:
        raise UnsupportedArchitectureError(
            f"{repo_id}/{name}: GGUF architecture {arch!r} has no converter; supported GGUF architectures: "
            + ", ".join(sorted(GGUF_ARCHITECTURES)))


def _remote_gguf(target: PullTarget, store: Store, force: bool, report: Report) -> Fetched:
    source = target.recipe.source
    assert source.repo_id is not None and source.path is not None
    report(PullEvent(f"pulling manifest of {source.repo_id}"))
    revision, sizes = hub.fetch_file_sizes(source.repo_id, source.revision)
    m = SPLIT_GGUF.match(Path(source.path).name)
    names = [source.path] if not m else [
        str(Path(source.path).with_name(f"{m['stem']}-{k:05d}-of-{m['count']}.gguf")) for k in range(1, int(m["count"]) + 1)
    ]
    missing = [n for n in names if n not in sizes]
    if missing:
        raise PullError(f"{source.repo_id}@{revision[:12]} has no {', '.join(missing)}; check the file name in the recipe")
    files = tuple(hub.RemoteFile(n, sizes[n]) for n in names)
    _check_gguf_architecture(source.repo_id, revision, names[0])
    # GGUF headers are not read before the download: count every byte as host-resident (conservative).
    total = sum(f.size for f in files)
    _fit(target, store, Footprint(download_bytes=_remaining(store, source.repo_id, revision, files),
                                  expert_bytes=total, dense_bytes=0), force)
    download_dir = _download(target, store, revision, files, report)
    return Fetched(download_dir / names[0], "gguf", revision, download_dir, tuple(names))
