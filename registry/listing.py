"""Walking ``manifests/``: which models exist, which files are damaged, which blobs are in use."""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NamedTuple

from .errors import CorruptManifestError, InvalidNameError
from .manifest import Manifest
from .names import ModelName

log = logging.getLogger(__name__)

_ANY_DIGEST_RE = re.compile(rb"sha256:[0-9a-f]{64}")


class ModelEntry(NamedTuple):
    """One listed model: its name, manifest and the manifest's mtime (seconds since the epoch)."""

    name: ModelName
    manifest: Manifest
    modified_time: float


class SkippedManifest(NamedTuple):
    """A file under ``manifests/`` that could not be listed, and why."""

    path: Path
    reason: str


def manifest_files(manifests_dir: Path) -> Iterator[Path]:
    """Every non-hidden file under `manifests_dir`, at any depth so that misplaced files show up.

    Hidden files are atomic-write temp files (no name part may start with a dot).
    """
    for dirpath, dirnames, filenames in os.walk(manifests_dir):
        dirnames[:] = [d for d in dirnames if not d.startswith(".")]
        for fname in filenames:
            if not fname.startswith("."):
                yield Path(dirpath) / fname


def scan_manifests(
    manifests_dir: Path, read: Callable[[ModelName], Manifest]
) -> tuple[list[ModelEntry], list[SkippedManifest]]:
    """Readable models sorted by name, and the files that are not valid manifests."""
    entries: list[ModelEntry] = []
    skipped: list[SkippedManifest] = []
    for path in sorted(manifest_files(manifests_dir)):
        parts = path.relative_to(manifests_dir).parts
        try:
            name = ModelName(*parts)
        except (InvalidNameError, TypeError) as exc:
            skipped.append(SkippedManifest(path, f"path is not a valid model name ({exc})"))
            continue
        try:
            manifest = read(name)
            mtime = path.stat().st_mtime
        except (CorruptManifestError, OSError) as exc:
            skipped.append(SkippedManifest(path, str(exc)))
            continue
        entries.append(ModelEntry(name, manifest, mtime))
    entries.sort(key=lambda e: str(e.name))
    return entries, skipped


def referenced_digests(entries: list[ModelEntry], skipped: list[SkippedManifest]) -> set[str] | None:
    """Digests gc must keep: those of every manifest, plus any digest-looking string in a damaged
    manifest file (so a damaged manifest never costs its blobs). None if a file is unreadable."""
    keep = {digest for entry in entries for digest in entry.manifest.digests}
    for s in skipped:
        try:
            raw = s.path.read_bytes()
        except OSError as exc:
            log.warning("cannot read %s to know which blobs it needs (%s)", s.path, exc)
            return None
        keep.update(m.decode() for m in _ANY_DIGEST_RE.findall(raw))
    return keep
