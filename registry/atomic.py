"""Crash-safe file writes: temp file in the target's directory, flush, fsync, rename, fsync dir.

A reader sees either the old file or the complete new one, never a partial write. If the
process dies mid-write, only a temp file named ``.<target>.tmp-<pid>-<token>`` remains. Its writer
holds an exclusive `flock` on it from creation to rename, so `registry.tmpdirs.cleanup_stale`
can tell a dead writer's file (no lock; the pid in its name not running) from a live one's in
any pid namespace, and remove it at once.
"""

from __future__ import annotations

import fcntl
import os
import secrets
from pathlib import Path
from types import TracebackType
from typing import BinaryIO

TEMP_MARKER = ".tmp-"


def temp_name_for(target: Path) -> Path:
    """A unique hidden temp path next to `target`, carrying this process's pid."""
    return target.with_name(f".{target.name}{TEMP_MARKER}{os.getpid()}-{secrets.token_hex(4)}")


def _open_locked(target: Path) -> tuple[Path, int]:
    """Create a fresh temp file for `target`, locked as this writer's (see the module docstring)."""
    while True:
        path = temp_name_for(target)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # (blocks only while a cleanup looks at it: a moment)
        except OSError:  # a filesystem without flock: cleanup goes by the pid and age alone
            return path, fd
        try:
            if os.path.samestat(os.fstat(fd), os.stat(path)):
                return path, fd
        except FileNotFoundError:
            pass
        os.close(fd)  # a cleanup removed it between create and lock, taking it for a dead writer's


def fsync_dir(path: Path) -> None:
    """fsync a directory so that renames and unlinks inside it survive a power loss."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class AtomicWriter:
    """Write a file atomically; use as a context manager or call `commit` / `discard` yourself.

        with AtomicWriter(path) as f:
            f.write(data)            # committed on normal exit, discarded on an exception

    `commit` makes the data durable and renames it over the target; `discard` removes the temp
    file. Either may be called inside the ``with`` block, which then does nothing more.
    """

    def __init__(self, target: Path) -> None:
        self.target = Path(target)
        self.temp_path, fd = _open_locked(self.target)
        self.file: BinaryIO = os.fdopen(fd, "wb")
        self._done = False

    def write(self, data: bytes) -> int:
        """Append `data` to the temp file."""
        return self.file.write(data)

    def commit(self) -> None:
        """Flush, fsync, rename over the target and fsync the directory."""
        if self._done:
            raise RuntimeError(f"AtomicWriter for {self.target} already finished")
        try:
            self.file.flush()
            os.fsync(self.file.fileno())
            os.replace(self.temp_path, self.target)  # still open, so still locked until it has its name
        except BaseException:
            self.discard()
            raise
        self._done = True
        self.file.close()
        fsync_dir(self.target.parent)

    def discard(self) -> None:
        """Drop the temp file; the target is left as it was."""
        self._done = True
        try:
            self.file.close()
        finally:
            try:
                os.unlink(self.temp_path)
            except FileNotFoundError:
                pass

    def __enter__(self) -> BinaryIO:
        return self.file

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._done:
            return
        if exc_type is None:
            self.commit()
        else:
            self.discard()


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Replace `path` with `data` atomically and durably."""
    with AtomicWriter(Path(path)) as f:
        f.write(data)
