"""Re-hash the blobs of a manifest and report every one that is missing, truncated or corrupt;
and check that the manifest and a model's FTW index agree about its shards."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

from .blobs import BlobRef, BlobStore, ProgressFn, hash_stream
from .manifest import Descriptor, Manifest
from .model_manifest import MEDIA_FTW_SHARD

Problem = Literal["missing", "truncated", "oversized", "corrupt"]
# A quick check (a load's, a pull's of a stored model) hashes whole the blobs of at most this size
# (configs, tokenizers, indexes, a small model's shards: ~40 ms at most each), where 64 samples of
# 64 KiB cover little of them (half of the tiny model's 8 MB shard: a byte flipped between two
# samples was run without a word). Shards are up to 4 GiB: those are sampled, as their full hash
# would add seconds a GiB to every load.
QUICK_FULL_HASH_MAX_BYTES = 64 << 20


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
            "corrupt": f"corrupt: sha256 is {self.actual_digest}, expected {self.digest}" if self.actual_digest
                       else "corrupt: bytes it had when it was stored differ (a sampled check)",
        }[self.problem]
        return f"{self.title} ({self.path}): {detail}"


def verify_manifest(blobs: BlobStore, manifest: Manifest, progress: ProgressFn | None = None, *,
                    rehash: bool = True) -> list[BadBlob]:
    """Check every distinct blob of `manifest`; returns the bad ones (empty when all are good).

    `progress(bytes_done, bytes_total)` is called as bytes are hashed; a missing or wrongly
    sized blob is not read but counts as done, so that the total is always reached. Without
    `rehash`, the quick check: presence, sizes, the sha256 of blobs of at most
    QUICK_FULL_HASH_MAX_BYTES and the sampled digest of larger ones (blobs.py: 4 MiB read a
    blob): missing, truncated, oversized, and corrupt where the hash or samples say so. A full
    hash that finds a blob good keeps its sampled digest anew.
    """
    unique: dict[tuple[str, int], Descriptor] = {}
    for d in manifest.blobs:  # (a digest named twice with two sizes: both checked, one is wrong)
        unique.setdefault((d.digest, d.size), d)
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
        found = _check_one(blobs, d, tick, rehash)
        if done != start + d.size:
            tick(start + d.size - done)
        if found is not None:
            bad.append(found)
    return bad


def _check_one(blobs: BlobStore, d: Descriptor, tick: Callable[[int], None], rehash: bool = True) -> BadBlob | None:
    path = blobs.path(d.digest)

    def bad(problem: Problem, size: int | None = None, digest: str | None = None) -> BadBlob:
        return BadBlob(d.digest, d.title, path, problem, d.size, size, digest)

    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return bad("missing")
    if size != d.size:
        return bad("truncated" if size < d.size else "oversized", size)
    if not rehash and d.size > QUICK_FULL_HASH_MAX_BYTES:
        try:
            sampled = blobs.sample_matches(d.digest, d.size)
        except FileNotFoundError:  # removed while we looked
            return bad("missing")
        return bad("corrupt", size) if sampled is False else None
    try:
        with open(path, "rb") as f:
            ref = hash_stream(f, on_chunk=tick)
    except FileNotFoundError:  # removed while we looked
        return bad("missing")
    if ref.size != d.size:  # changed while we read it
        return bad("truncated" if ref.size < d.size else "oversized", ref.size, ref.digest)
    if ref.digest != d.digest:
        return bad("corrupt", ref.size, ref.digest)
    if rehash:  # (a quick check of a small blob keeps what it found: it writes nothing in the store)
        blobs.record_sample(BlobRef(d.digest, d.size))
    return None


def sampled_check(path: Path, d: Descriptor) -> BadBlob | None:
    """One stored blob checked as a load can afford: present, its size, and its sha256 where it
    is small (QUICK_FULL_HASH_MAX_BYTES), else its sampled digest."""
    return _check_one(BlobStore(path.parent), d, lambda n: None, rehash=False)


class IndexShard(Protocol):
    """A shard as an FTW index names it (ftw.ShardEntry is one): file name, bytes, sha256 hex."""

    name: str
    size: int
    sha256: str


@dataclass(frozen=True)
class Disagreement:
    """The manifest and the FTW index disagree about a shard: `title` is its file name, `field`
    what differs (``sha256``, ``size``, ``listed``), `detail` both sides' words."""

    title: str
    field: str
    detail: str
    problem: Literal["disagrees"] = "disagrees"

    def __str__(self) -> str:
        return f"{self.title}: {self.detail}"


def check_index_agrees(manifest: Manifest, index_shards: Iterable[IndexShard],
                       index_title: str = "model.ftw.json") -> list[Disagreement]:
    """Every way the shards the FTW index names (`index_shards`, from `index_title`) and the
    manifest's shard layers differ: each named shard must be listed once, with the index's sha256
    as its digest and the index's size; no shard layer may be one the index does not name. The
    registry reads no FTW: the caller parses the index (through ftw) and passes its shards."""
    layers = {d.title: (i, d) for i, d in enumerate(manifest.layers) if d.media_type == MEDIA_FTW_SHARD}
    shards = list(index_shards)
    out: list[Disagreement] = []
    for name, count in Counter(s.name for s in shards).items():
        if count > 1:
            out.append(Disagreement(name, "listed", f"{index_title} names this shard {count} times"))
    for k, s in enumerate(shards):
        where = f"{index_title} shards[{k}]"
        if s.name not in layers:
            out.append(Disagreement(s.name, "listed", f"{where} names it, but no shard layer of the manifest "
                                    f"({MEDIA_FTW_SHARD}) is titled so"))
            continue
        i, d = layers[s.name]
        if d.digest != "sha256:" + s.sha256:
            out.append(Disagreement(s.name, "sha256", f"{where}.sha256 is {s.sha256}, the manifest's "
                                    f"layers[{i}].digest is {d.digest}"))
        if d.size != s.size:
            out.append(Disagreement(s.name, "size", f"{where}.size is {s.size} bytes, the manifest's "
                                    f"layers[{i}].size is {d.size}"))
    named = {s.name for s in shards}
    for title, (i, _) in layers.items():
        if title not in named:
            out.append(Disagreement(title, "listed", f"the manifest's layers[{i}] is a shard {index_title} does "
                                    "not name"))
    return out
