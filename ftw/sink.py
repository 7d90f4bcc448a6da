"""A shard file being written: bytes are hashed and written on a background thread.

hashlib and file writes release the GIL, so the converter reads the next chunk of the source
while this thread hashes and writes the previous one. The queue is bounded, which bounds the
memory in flight to `max_pending` buffers.
"""

from __future__ import annotations

import errno
import hashlib
import os
import queue
import threading
from pathlib import Path

from .errors import FTWError

_ZEROS = bytes(1 << 16)


class DiskFullError(FTWError, OSError):
    """The disk filled up while a shard was written."""


class ShardSink:
    """Append-only writer of one shard: `write` queues a buffer, `close` returns the sha256."""

    def __init__(self, path: Path, *, max_pending: int = 4) -> None:
        self.path = path
        self.size = 0
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        self._hash = hashlib.sha256()
        self._queue: queue.Queue[memoryview | None] = queue.Queue(maxsize=max_pending)
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._drain, name=f"ftw-sink-{path.name}", daemon=True)
        self._thread.start()

    def write(self, data: bytes | bytearray | memoryview) -> None:
        """Queue `data` for hashing and writing. The caller must not modify it afterwards."""
        self._raise_if_failed()
        view = memoryview(data).cast("B")
        if view.nbytes:
            self._queue.put(view)
            self.size += view.nbytes

    def pad_to(self, alignment: int) -> None:
        gap = (-self.size) % alignment
        while gap:
            n = min(gap, len(_ZEROS))
            self.write(_ZEROS[:n])
            gap -= n

    def close(self) -> str:
        """Flush, fsync and close; returns the hex sha256 of everything written."""
        self._queue.put(None)
        self._thread.join()
        try:
            self._raise_if_failed()
            os.fsync(self._fd)
        finally:
            os.close(self._fd)
        return self._hash.hexdigest()

    def abort(self) -> None:
        """Stop writing and close without fsync (the caller deletes the file)."""
        if self._thread.is_alive():
            self._error = self._error or FTWError("aborted")
            while True:  # unblock the producer side and let the thread finish
                try:
                    self._queue.put_nowait(None)
                    break
                except queue.Full:
                    try:
                        self._queue.get_nowait()
                    except queue.Empty:
                        pass
            self._thread.join()
        os.close(self._fd)

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

    def _drain(self) -> None:
        while True:
            view = self._queue.get()
            if view is None:
                return
            if self._error is not None:
                continue
            try:
                self._hash.update(view)
                while view.nbytes:
                    written = os.write(self._fd, view)
                    view = view[written:]
            except BaseException as e:  # reported to the producer on its next call
                self._error = e


def _free_bytes(directory: Path) -> int:
    try:
        st = os.statvfs(directory)
    except OSError:
        return 0
    return st.f_bavail * st.f_frsize
