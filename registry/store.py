"""The local model store: manifests naming sha256-addressed blobs, with locks, gc and verify.

Layout under the root (``$FT_HOME``, default ``~/.ft``)::

    manifests/<host>/<namespace>/<model>/<tag>   JSON manifest (see registry.manifest)
    blobs/sha256-<64 hex>                        immutable content-addressed files
    tmp/<prefix>-pid<pid>-<token>/               per-process work directories
    locks/<sha256 of the name>.lock, gc.lock     flock files (never deleted)

Crash safety: every file is written to a temp file beside it, fsynced and renamed; blobs are
verified before they get their final name; a model's manifest is written only after all its
blobs are in place. So a crash never leaves a listed model with missing blobs, only orphan blobs
(removed by `gc`) and temp files of a dead pid (removed by `cleanup_stale`).

Concurrency protocol (between processes, and threads of one process):

* ``lock(name)`` is an exclusive lock per model name. Whoever writes or removes a manifest holds
  it (`remove` and `copy` take it themselves; a pull takes it around fetch + write_manifest), so
  two pulls of one model do not interleave: the second waits and then finds the model there.
* ``pull_session()`` is a shared lock on ``locks/gc.lock``; ``gc`` takes it exclusively. Hold a
  pull session from before the first `add_blob_*` of a model until after its `write_manifest`:
  the new blobs are referenced by no manifest until then, and gc must not delete them. Many
  pulls can run at once; gc waits until none runs, and pulls wait while gc runs.
* Lock order: ``pull_session()`` before ``lock(name)``. `remove` releases the model lock before
  its gc, and runs it with ``wait=False``: while a pull session is open anywhere, the gc is
  skipped (logged) and the orphan blobs wait for the next gc.
* Locks are re-entrant within one thread. A thread inside its own pull session cannot gc:
  ``gc(wait=False)`` skips, ``gc(wait=True)`` raises RuntimeError.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import BinaryIO

from . import tmpdirs
from .atomic import AtomicWriter, fsync_dir
from .blobs import BlobRef, BlobStore, ProgressFn
from .errors import CorruptManifestError, MissingBlobError, ModelNotFoundError, RegistryError
from .listing import ModelEntry, SkippedManifest, referenced_digests, scan_manifests
from .locks import file_lock, holds_lock
from .manifest import Manifest
from .model_manifest import check_model_manifest
from .names import ModelName, as_name
from .verify import BadBlob, verify_manifest

log = logging.getLogger(__name__)


class Store:
    """A local model store rooted at `root` (created if missing). See the module docstring."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root).expanduser().absolute()
        self.manifests_dir = self.root / "manifests"
        self.blobs_dir = self.root / "blobs"
        self.tmp_dir = self.root / "tmp"
        self.locks_dir = self.root / "locks"
        for d in (self.manifests_dir, self.blobs_dir, self.tmp_dir, self.locks_dir):
            d.mkdir(parents=True, exist_ok=True)
        self._blobs = BlobStore(self.blobs_dir)

    @classmethod
    def default(cls) -> Store:
        """The store at ``$FT_HOME``, or ``~/.ft`` when it is unset."""
        home = os.environ.get("FT_HOME")
        return cls(Path(home) if home else Path.home() / ".ft")

    def __repr__(self) -> str:
        return f"Store({str(self.root)!r})"

    # ---- blobs -------------------------------------------------------------------------------

    def blob_path(self, digest: str) -> Path:
        """Path of the blob with `digest` (``sha256:<hex>``), whether or not it exists."""
        return self._blobs.path(digest)

    def has_blob(self, digest: str) -> bool:
        """Whether the blob is stored."""
        return self._blobs.has(digest)

    def open_blob(self, digest: str) -> BinaryIO:
        """Open a blob for reading; `MissingBlobError` if absent."""
        return self._blobs.open(digest)

    def add_blob_file(self, path: Path, digest: str | None = None, move: bool = True) -> BlobRef:
        """Hash `path` (streaming), check it against `digest` if given, and store it.

        With `move` the file is renamed in (copied across filesystems) and gone from `path`;
        otherwise copied. An already stored blob is kept. Raises `DigestMismatchError`.
        Call it inside `pull_session()` so gc cannot remove the blob before its manifest exists.
        """
        return self._blobs.add_file(Path(path), digest, move)

    def add_blob_bytes(self, data: bytes, digest: str | None = None) -> BlobRef:
        """Store `data` as a blob (verified against `digest` if given). See `add_blob_file`."""
        return self._blobs.add_bytes(data, digest)

    def remove_blob(self, digest: str) -> bool:
        """Delete one blob even if referenced, e.g. one `verify` found corrupt, so that the next
        pull fetches it again. Returns whether it existed."""
        return self._blobs.remove(digest)

    # ---- manifests ---------------------------------------------------------------------------

    def manifest_path(self, name: ModelName | str) -> Path:
        """Where the manifest of `name` lives (whether or not it exists). A tag stored with capitals
        before names were folded to lower case is found under its own case."""
        path = self.manifests_dir.joinpath(*as_name(name).parts)
        if not path.exists() and path.parent.is_dir():
            legacy = [p for p in path.parent.iterdir() if p.name.lower() == path.name and p.is_file()]
            if len(legacy) == 1:
                return legacy[0]
        return path

    def has_model(self, name: ModelName | str) -> bool:
        """Whether a manifest exists for `name`."""
        return self.manifest_path(name).is_file()

    def read_manifest(self, name: ModelName | str) -> Manifest:
        """The manifest of `name`; `ModelNotFoundError` if absent, `CorruptManifestError` if bad
        (`InvalidModelManifestError` where an ft model's lacks a model's shape: model_manifest.py)."""
        name = as_name(name)
        path = self.manifest_path(name)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise ModelNotFoundError(name.display, self.names_near(name.display)) from None
        except OSError as exc:
            raise CorruptManifestError(str(path), f"unreadable ({exc})", name.display) from None
        manifest = Manifest.from_json(data, source=str(path), name=name.display)
        return check_model_manifest(manifest, str(path), name.display)

    def write_manifest(self, name: ModelName | str, manifest: Manifest) -> None:
        """Atomically write the manifest of `name`, replacing any previous one.

        Refuses with `MissingBlobError` unless every blob it references is stored with the
        declared size: the manifest is always the last thing a pull writes.
        """
        name = as_name(name)
        missing = []
        for d in manifest.blobs:
            try:
                if self.blob_path(d.digest).stat().st_size != d.size:
                    missing.append(d.digest)
            except FileNotFoundError:
                missing.append(d.digest)
        if missing:
            raise MissingBlobError(
                missing, f"refusing to write manifest of {name.display} (blobs missing or of the wrong size)"
            )
        path = self.manifest_path(name)
        data = manifest.to_json()
        for attempt in range(5):
            path.parent.mkdir(parents=True, exist_ok=True)
            try:
                with AtomicWriter(path) as f:
                    f.write(data)
                return
            except FileNotFoundError:
                # a concurrent `remove` pruned the (then empty) directory between mkdir and open
                if attempt == 4:
                    raise

    def scan_models(self) -> tuple[list[ModelEntry], list[SkippedManifest]]:
        """All readable models (sorted by name) and the manifest files that could not be read."""
        return scan_manifests(self.manifests_dir, self.read_manifest)

    def names_near(self, display: str, most: int = 2) -> list[str]:
        """Stored model names that look like `display` (difflib's ratio >= 0.75), closest first."""
        import difflib

        try:
            stored = [e.name.display for e in self.list_models()]
        except (OSError, RegistryError):  # a store we cannot list: no suggestion, the error stands
            return []
        return difflib.get_close_matches(display, stored, n=most, cutoff=0.75)

    def list_models(self) -> list[ModelEntry]:
        """All readable models, sorted by name; unreadable manifests are logged and skipped."""
        entries, skipped = self.scan_models()
        for s in skipped:
            log.warning("skipping manifest %s: %s", s.path, s.reason)
        return entries

    def remove(self, name: ModelName | str, timeout_s: float | None = 60.0) -> list[str]:
        """Delete the manifest of `name` (pruning empty directories), then gc without waiting.

        Returns the digests of the blobs that gc removed. `ModelNotFoundError` if absent.
        """
        name = as_name(name)
        with self.lock(name, timeout_s=timeout_s):
            path = self.manifest_path(name)
            try:
                path.unlink()
            except FileNotFoundError:
                raise ModelNotFoundError(name.display, self.names_near(name.display)) from None
            fsync_dir(path.parent)
            self._prune_dirs(path.parent)
        return self.gc(wait=False)

    def _prune_dirs(self, directory: Path) -> None:
        while directory != self.manifests_dir and self.manifests_dir in directory.parents:
            try:
                directory.rmdir()
            except OSError:  # not empty (another tag, or a write in progress)
                return
            directory = directory.parent

    def copy(self, src: ModelName | str, dst: ModelName | str, timeout_s: float | None = 60.0) -> None:
        """Make `dst` name the same blobs as `src` (replacing `dst` if it exists)."""
        src, dst = as_name(src), as_name(dst)
        with self.pull_session(timeout_s=timeout_s), self.lock(dst, timeout_s=timeout_s):
            self.write_manifest(dst, self.read_manifest(src))

    # ---- gc and locks ------------------------------------------------------------------------

    @property
    def _gc_lock_path(self) -> Path:
        return self.locks_dir / "gc.lock"

    def unreferenced_bytes(self, among: set[str] | None = None) -> int:
        """Bytes of the blobs no manifest names (of those `among`, e.g. a removed model's): what
        the next gc frees (0 where a manifest is unreadable: gc keeps everything then). Without
        `among`, a pull's blobs not yet named by its manifest count too."""
        keep = referenced_digests(*self.scan_models())
        if keep is None:
            return 0
        total = 0
        for digest in (self._blobs.digests() if among is None else among & self._blobs.digests()) - keep:
            try:
                total += self._blobs.path(digest).stat().st_size
            except OSError:  # removed meanwhile
                pass
        return total

    def gc(self, wait: bool = True, timeout_s: float | None = 600.0) -> list[str]:
        """Delete every blob no manifest references; returns the removed digests, sorted.

        Waits (up to `timeout_s`, then `LockTimeoutError`) while pull sessions are open; with
        ``wait=False`` it returns [] at once instead, logging why. Digests appearing anywhere in
        an unparsable manifest file are kept, so a damaged manifest never costs its blobs.
        """
        if holds_lock(self._gc_lock_path):
            if not wait:
                log.info("gc skipped: this thread is inside a pull session")
                return []
            raise RuntimeError("gc(wait=True) inside this thread's own pull_session() would never finish")
        with file_lock(self._gc_lock_path, shared=False, timeout_s=timeout_s, blocking=wait,
                       what="the store for gc (a pull or copy is in progress)") as held:
            if not held:
                log.info("gc skipped: a pull or copy is in progress; unreferenced blobs stay until the next gc")
                return []
            keep = referenced_digests(*self.scan_models())
            if keep is None:
                log.warning("gc skipped: a manifest file is unreadable")
                return []
            removed = []
            for digest in sorted(self._blobs.digests() - keep):
                if self._blobs.remove(digest):
                    removed.append(digest)
            if removed:
                log.info("gc removed %d unreferenced blob(s)", len(removed))
            return removed

    def lock(self, name: ModelName | str, timeout_s: float | None = 60.0) -> AbstractContextManager[bool]:
        """Exclusive per-model lock (see the module docstring); `LockTimeoutError` after
        `timeout_s` (None: wait forever), naming the model and the process holding it."""
        name = as_name(name)
        key = hashlib.sha256(str(name).encode()).hexdigest()
        return file_lock(self.locks_dir / f"{key}.lock", timeout_s=timeout_s, what=f"model {name.display}")

    def download_lock(self, source: str, timeout_s: float | None = None) -> AbstractContextManager[bool]:
        """Exclusive lock on the downloads of one source (a repository): two models pulled from it
        under different names share its download directory, which each deletes when done."""
        key = hashlib.sha256(source.encode()).hexdigest()
        return file_lock(self.locks_dir / f"download-{key}.lock", timeout_s=timeout_s, what=f"the download of {source}")

    def pull_session(self, timeout_s: float | None = 600.0) -> AbstractContextManager[bool]:
        """Shared store lock that keeps gc away while blobs are added (see the module docstring)."""
        return file_lock(self._gc_lock_path, shared=True, timeout_s=timeout_s,
                         what="the store (a gc is running)")

    # ---- work directories, verify, disk ------------------------------------------------------

    @contextmanager
    def temp_dir(self, prefix: str = "work") -> Iterator[Path]:
        """A fresh work dir under ``tmp/`` named with this pid; removed on exit, error or not."""
        with tmpdirs.temp_dir(self.tmp_dir, prefix) as path:
            yield path

    def cleanup_stale(self) -> list[Path]:
        """Remove work dirs and temp files left by processes that no longer run; returns them."""
        return tmpdirs.cleanup_stale(self.tmp_dir, [self.blobs_dir, self.manifests_dir])

    def verify(self, name: ModelName | str, progress: ProgressFn | None = None, *, rehash: bool = True) -> list[BadBlob]:
        """Re-hash every blob of `name`; returns the missing, truncated or corrupt ones.

        `progress(bytes_done, bytes_total)` is called while hashing. Without `rehash`, sizes, the
        sha256 of small blobs and the sampled digests of large ones (64 MiB read a blob at most:
        what a pull or a load can afford every time; verify.QUICK_FULL_HASH_MAX_BYTES).
        """
        return verify_manifest(self._blobs, self.read_manifest(name), progress, rehash=rehash)

    def disk_free_bytes(self) -> int:
        """Bytes available to this user on the store's filesystem."""
        st = os.statvfs(self.root)
        return st.f_bavail * st.f_frsize
