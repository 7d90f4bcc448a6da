"""Content-addressed blob storage: ``blobs/sha256-<hex>``, one immutable file per digest.

Blobs are hashed while streaming (never read whole into memory), verified against the digest the
caller expects, and renamed into place, so a blob file either is complete and correct or does
not exist under its final name.
"""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from .atomic import AtomicWriter, fsync_dir
from .errors import DigestMismatchError, MissingBlobError
from .manifest import Descriptor, check_digest

log = logging.getLogger(__name__)

CHUNK_BYTES = 4 << 20
_BLOB_FILE_RE = re.compile(r"sha256-([0-9a-f]{64})")
# A blob's sampled digest: its size and SAMPLE_CHUNKS pieces of SAMPLE_BYTES spread evenly over it
# (the whole blob when smaller), hashed when the blob is stored and verified, and kept beside it
# (`sha256-<hex>.sample`). Checking it costs 4 MiB of reads a blob, not the blob: loading a model
# checks it, so that a blob rotted on the disk since it was stored is found before it gives
# garbage (a flipped bit between two samples is not; `ft verify` hashes everything).
SAMPLE_CHUNKS, SAMPLE_BYTES = 64, 64 << 10
SAMPLE_SUFFIX = ".sample"


def sample_digest(path: Path, size: int) -> str:
    """The sampled digest of the `size`-byte file at `path` (hex)."""
    h = hashlib.sha256(size.to_bytes(8, "little"))
    with open(path, "rb") as f:
        if size <= SAMPLE_CHUNKS * SAMPLE_BYTES:
            h.update(f.read())
        else:
            for i in range(SAMPLE_CHUNKS):
                f.seek((size - SAMPLE_BYTES) * i // (SAMPLE_CHUNKS - 1))
                h.update(f.read(SAMPLE_BYTES))
    return h.hexdigest()

ProgressFn = Callable[[int, int], None]
"""progress(bytes_done, bytes_total)"""


@dataclass(frozen=True)
class BlobRef:
    """A stored blob's digest (``sha256:<hex>``) and size in bytes."""

    digest: str
    size: int

    def descriptor(self, media_type: str, annotations: dict[str, str] | None = None) -> Descriptor:
        """A manifest `Descriptor` for this blob."""
        return Descriptor(media_type=media_type, digest=self.digest, size=self.size,
                          annotations=dict(annotations or {}))


def digest_bytes(data: bytes) -> str:
    """``sha256:<hex>`` of `data`."""
    return "sha256:" + hashlib.sha256(data).hexdigest()


def hash_stream(f: BinaryIO, on_chunk: Callable[[int], None] | None = None,
                out: BinaryIO | None = None) -> BlobRef:
    """Hash `f` to its end in `CHUNK_BYTES` pieces, copying them to `out` if given.

    `on_chunk(n)` is called with the size of each piece read.
    """
    h = hashlib.sha256()
    size = 0
    while chunk := f.read(CHUNK_BYTES):
        h.update(chunk)
        size += len(chunk)
        if out is not None:
            out.write(chunk)
        if on_chunk is not None:
            on_chunk(len(chunk))
    return BlobRef("sha256:" + h.hexdigest(), size)


def hash_file(path: Path, *, fsync: bool = False) -> BlobRef:
    """Digest and size of the file at `path`; with `fsync`, also flush it to disk."""
    with open(path, "rb") as f:
        ref = hash_stream(f)
        if fsync:
            os.fsync(f.fileno())
    return ref


class BlobStore:
    """The ``blobs/`` directory of a store. `Store` delegates to it; use that instead."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def path(self, digest: str) -> Path:
        """Where the blob with `digest` lives (whether or not it exists)."""
        return self.root / ("sha256-" + check_digest(digest)[len("sha256:"):])

    def has(self, digest: str) -> bool:
        """Whether the blob file exists."""
        return self.path(digest).is_file()

    def open(self, digest: str) -> BinaryIO:
        """Open the blob for binary reading; raises `MissingBlobError` when it is absent."""
        try:
            return open(self.path(digest), "rb")
        except FileNotFoundError:
            raise MissingBlobError([digest], "cannot open blob") from None

    def digests(self) -> set[str]:
        """Digests of every blob file present (temp files excluded)."""
        found = set()
        with os.scandir(self.root) as entries:
            for entry in entries:
                m = _BLOB_FILE_RE.fullmatch(entry.name)
                if m and entry.is_file(follow_symlinks=False):
                    found.add("sha256:" + m.group(1))
        return found

    def remove(self, digest: str) -> bool:
        """Delete the blob file (and its sampled digest); True if it existed."""
        self._forget_sample(digest)
        try:
            os.unlink(self.path(digest))
        except FileNotFoundError:
            return False
        fsync_dir(self.root)
        return True

    # -- sampled digests -----------------------------------------------------------------------------

    def _sample_path(self, digest: str) -> Path:
        return self.path(digest).with_name(self.path(digest).name + SAMPLE_SUFFIX)

    def record_sample(self, ref: BlobRef) -> None:
        """Keep the sampled digest of the stored blob `ref`, whose bytes were just verified."""
        try:
            with AtomicWriter(self._sample_path(ref.digest)) as f:
                f.write(sample_digest(self.path(ref.digest), ref.size).encode())
        except OSError as e:  # (a check the load then cannot make: the blob is stored all the same)
            log.warning("could not keep the sampled digest of blob %s: %s", ref.digest, e)

    def sample_matches(self, digest: str, size: int) -> bool | None:
        """Whether the stored blob still has the sampled digest it had when verified; None where
        none was kept (a blob stored by an earlier ft)."""
        try:
            kept = self._sample_path(digest).read_text().strip()
        except (FileNotFoundError, UnicodeDecodeError):
            return None
        return sample_digest(self.path(digest), size) == kept

    def _forget_sample(self, digest: str) -> None:
        try:
            os.unlink(self._sample_path(digest))
        except FileNotFoundError:
            pass

    def _present(self, ref: BlobRef) -> bool:
        dest = self.path(ref.digest)
        try:
            size = dest.stat().st_size
        except FileNotFoundError:
            return False
        if size == ref.size:
            return True
        log.warning("blob %s has %d bytes instead of %d; replacing it", dest, size, ref.size)
        return False

    def add_bytes(self, data: bytes, digest: str | None = None) -> BlobRef:
        """Store `data` as a blob, verifying it against `digest` when given."""
        ref = BlobRef(digest_bytes(data), len(data))
        _check(digest, ref, "in-memory data")
        if not (self._present(ref) and self.path(ref.digest).read_bytes() == data):  # (small: compared whole)
            with AtomicWriter(self.path(ref.digest)) as f:
                f.write(data)
        self.record_sample(ref)
        return ref

    def add_file(self, path: Path, digest: str | None = None, move: bool = True) -> BlobRef:
        """Store the file at `path` as a blob and return its digest and size.

        The file is hashed in streaming chunks and checked against `digest` when given
        (`DigestMismatchError` naming both digests if it differs; the file is then left where it
        is). With `move`, the file is renamed into the store (copied when it lies on another
        filesystem) and no longer exists at `path`; otherwise it is copied. If the blob is
        already stored, the verified file replaces it where a rename can (the stored one may have
        rotted: `ft verify`'s advice, rm and pull again, must heal it even when another model
        shares the blob); elsewhere the stored one is kept if its own bytes hash right.
        """
        src = Path(path)
        ref = hash_file(src, fsync=move)
        _check(digest, ref, str(src))
        dest = self.path(ref.digest)
        if move:
            try:
                os.replace(src, dest)
            except OSError as exc:
                if exc.errno != errno.EXDEV:
                    raise
            else:
                fsync_dir(self.root)
                self.record_sample(ref)
                return ref
        self._copy_in(src, ref)
        if move:
            src.unlink()
        self.record_sample(ref)
        return ref

    def _copy_in(self, src: Path, ref: BlobRef) -> None:
        if self._present(ref):  # kept if its bytes are right: a copy costs more than the check
            if hash_file(self.path(ref.digest)).digest == ref.digest:
                return
            log.warning("blob %s does not hash to its name; replacing it", self.path(ref.digest))
        with AtomicWriter(self.path(ref.digest)) as out, open(src, "rb") as f:
            copied = hash_stream(f, out=out)
            # the source may have changed since it was hashed; never store what we did not verify
            _check(ref.digest, copied, str(src))


def _check(expected: str | None, ref: BlobRef, what: str) -> None:
    if expected is not None and check_digest(expected) != ref.digest:
        raise DigestMismatchError(what, expected, ref.digest)
