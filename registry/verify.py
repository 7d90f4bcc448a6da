"""Re-hash the blobs of a manifest and report every one that is missing, truncated or corrupt."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from .blobs import BlobStore, ProgressFn, hash_stream
from .manifest import Descriptor, Manifest

Problem = Literal["missing", "truncated", "oversized", "corrupt"]


@dataclass(frozen=True)
class BadBlob:
    """A blob that failed verification.

    `problem` is ``missing`` (no file), ``truncated`` / ``oversized`` (size differs from the
    manifest) or ``corrupt`` (right size, wrong sha256). `title` is the blob's title
    annotation (e.g. a shard file name) or its digest.
    """

    digest: str
    title: str
    path: Path
    problem: Problem
    expected_size: int
    actual_size: int | None = None
    actual_digest: str | None = None

    def __str__(self) -> str:
        detail = {
            "missing": "missing",
            "truncated": f"truncated: {self.actual_size} of {self.expected_size} bytes",
            "oversized": f"too long: {self.actual_size} bytes, expected {self.expected_size}",
            "corrupt": f"corrupt: sha256 is {self.actual_digest}, expected {self.digest}",
        }[self.problem]
        return f"{self.title} ({self.path}): {detail}"


def verify_manifest(blobs: BlobStore, manifest: Manifest, progress: ProgressFn | None = None, *,
                    rehash: bool = True) -> list[BadBlob]:
    """Check every distinct blob of `manifest`; returns the bad ones (empty when all are good).

    `progress(bytes_done, bytes_total)` is called as bytes are hashed; a missing or wrongly
    sized blob is not read but counts as done, so that the total is always reached. Without
    `rehash`, only presence and sizes are checked (no blob is read): missing, truncated, oversized.
    """
    unique: dict[str, Descriptor] = {}
    for d in manifest.blobs:
        unique.setdefault(d.digest, d)
    total = sum(d.size for d in unique.values())
    done = 0

    def tick(n: int) -> None:
        nonlocal done
        done += n
        if progress is not None:
            progress(done, total)

    bad: list[BadBlob] = []
    if progress is not None:
        progress(0, total)
    for d in unique.values():
        start = done
        found = _check_one(blobs.path(d.digest), d, tick, rehash)
        if done != start + d.size:
            tick(start + d.size - done)
        if found is not None:
            bad.append(found)
    return bad


def _check_one(path: Path, d: Descriptor, tick: Callable[[int], None], rehash: bool = True) -> BadBlob | None:
    def bad(problem: Problem, size: int | None = None, digest: str | None = None) -> BadBlob:
        return BadBlob(d.digest, d.title, path, problem, d.size, size, digest)

    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return bad("missing")
    if size != d.size:
        return bad("truncated" if size < d.size else "oversized", size)
    if not rehash:
        return None
    try:
        with open(path, "rb") as f:
            ref = hash_stream(f, on_chunk=tick)
    except FileNotFoundError:  # removed while we looked
        return bad("missing")
    if ref.size != d.size:  # changed while we read it
        return bad("truncated" if ref.size < d.size else "oversized", ref.size, ref.digest)
    if ref.digest != d.digest:
        return bad("corrupt", ref.size, ref.digest)
    return None
