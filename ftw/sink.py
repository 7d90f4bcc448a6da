"""A shard file being written: bytes are hashed and written on two background threads.

hashlib and file writes release the GIL, so the converter reads the next chunk of the source
while one thread hashes and another writes the chunks before it (the hash and the write of a
chunk overlap instead of adding up). `write` blocks while more than `max_inflight_bytes` are
queued, which bounds the memory in flight.
"""

from __future__ import annotations

import errno
import hashlib
import os
import queue
import threading
from collections.abc import Callable
from pathlib import Path

from .errors import FTWError

_ZEROS = bytes(1 << 16)


class DiskFullError(FTWError, OSError):
    """The disk filled up while a shard was written."""


class ShardSink:
    """Append-only writer of one shard: `write` queues a buffer, `close` returns the sha256."""

    def __init__(self, path: Path, *, max_inflight_bytes: int = 256 << 20) -> None:
        self.path = path
        self.size = 0  # bytes accepted by `write`
        self.max_inflight_bytes = max_inflight_bytes
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        self._hash = hashlib.sha256()
        self._error: BaseException | None = None
        # Flow control by bytes, not by buffer count: expert parts are small, dense chunks large.
        self._progress = threading.Condition()
        self._done = {"hash": 0, "write": 0}  # bytes each consumer has finished
        self._queues: list[queue.SimpleQueue[memoryview | None]] = []
        self._threads: list[threading.Thread] = []
        for role, work in (("hash", self._hash.update), ("write", self._write_all)):
            q: queue.SimpleQueue[memoryview | None] = queue.SimpleQueue()
            t = threading.Thread(target=self._drain, args=(role, q, work), name=f"ftw-{role}-{path.name}", daemon=True)
            self._queues.append(q)
            self._threads.append(t)
            t.start()

    def write(self, data: bytes | bytearray | memoryview) -> None:
        """Queue `data` for hashing and writing. The caller must not modify it afterwards."""
        self._raise_if_failed()
        view = memoryview(data).cast("B")
        if not view.nbytes:
            return
        with self._progress:
            while self.size - min(self._done.values()) > self.max_inflight_bytes and self._error is None:
                self._progress.wait()
        for q in self._queues:
            q.put(view)
        self.size += view.nbytes

    def pad_to(self, alignment: int) -> None:
        gap = (-self.size) % alignment
        while gap:
            n = min(gap, len(_ZEROS))
            self.write(_ZEROS[:n])
            gap -= n

    def close(self) -> str:
        """Flush, fsync and close; returns the hex sha256 of everything written."""
        self._stop_threads()
        try:
            self._raise_if_failed()
            os.fsync(self._fd)
        finally:
            os.close(self._fd)
        return self._hash.hexdigest()

    def abort(self) -> None:
        """Stop writing and close without fsync (the caller deletes the file)."""
        self._error = self._error or FTWError("aborted")  # the threads skip queued work from now on
        self._stop_threads()
        os.close(self._fd)

    def _stop_threads(self) -> None:
        for q in self._queues:
            q.put(None)
        for t in self._threads:
            t.join()

    def _raise_if_failed(self) -> None:
        if self._error is None:
            return
        err = self._error
        if isinstance(err, OSError) and err.errno == errno.ENOSPC:
            free = _free_bytes(self.path.parent)
            raise DiskFullError(
                errno.ENOSPC,
                f"disk full while writing {self.path} ({free / 2**30:.2f} GiB free); "
                "free some space or point FT_HOME at a larger disk, then pull again",
            ) from err
        raise FTWError(f"writing {self.path} failed: {err}") from err

    def _write_all(self, view: memoryview) -> None:
        while view.nbytes:
            written = os.write(self._fd, view)
            view = view[written:]

    def _drain(self, role: str, q: queue.SimpleQueue[memoryview | None], work: Callable[[memoryview], object]) -> None:
        while True:
            view = q.get()
            if view is None:
                return
            if self._error is None:
                try:
                    work(view)
                except BaseException as e:  # reported to the producer on its next call
                    self._error = e
            with self._progress:
                self._done[role] += view.nbytes
                self._progress.notify_all()


def _free_bytes(directory: Path) -> int:
    try:
        st = os.statvfs(directory)
    except OSError:
        return 0
    return st.f_bavail * st.f_frsize
