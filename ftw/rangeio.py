"""Reading byte ranges of source files: the one loop every reader in ftw/ shares.

`TensorFiles` keeps a file descriptor per source file and reads a tensor's bytes (or a slice of
them) into fresh buffers with pread, so only the bytes asked for are touched and the GIL is
released while the disk works. `readahead` keeps several such reads in flight on a pool.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Executor, Future
from pathlib import Path
from typing import Protocol, TypeVar

import numpy as np

from .errors import SourceError

CHUNK_BYTES = 64 << 20
T = TypeVar("T")


class ByteRange(Protocol):
    """A tensor as stored in a source file."""

    name: str
    file: Path
    offset: int
    nbytes: int


def pread_into(fd: int, out: memoryview, offset: int, ended_early: Callable[[int], Exception]) -> int:
    """Fill `out` from `fd` at `offset` in CHUNK_BYTES preads; `ended_early(pos)` if the file stops."""
    done, total = 0, out.nbytes
    while done < total:
        n = os.preadv(fd, [out[done : done + CHUNK_BYTES]], offset + done)
        if n <= 0:
            raise ended_early(offset + done)
        done += n
    return done


def readahead(pool: Executor, read: Callable[[int], T], count: int, depth: int) -> Iterator[T]:
    """read(0), ..., read(count - 1) in order, with up to `depth` reads in flight on `pool`.

    Several reads outstanding keep the disk busy while the consumer works on what has arrived;
    `depth` bounds the memory they hold.
    """
    window: deque[Future[T]] = deque()
    submitted = 0
    try:
        for _ in range(count):
            while submitted < count and len(window) < depth:
                window.append(pool.submit(read, submitted))
                submitted += 1
            yield window.popleft().result()
    finally:
        for future in window:
            future.cancel()


class TensorFiles:
    """Byte-range reads of tensors living in a set of source files."""

    def __init__(self) -> None:
        self._fds: dict[Path, int] = {}

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()

    def __enter__(self) -> TensorFiles:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _fd(self, file: Path) -> int:
        fd = self._fds.get(file)
        if fd is None:
            fd = self._fds[file] = os.open(file, os.O_RDONLY)
        return fd

    def read_bytes(self, t: ByteRange, start: int = 0, length: int | None = None) -> np.ndarray:
        """Bytes [start, start+length) of tensor `t`, as a fresh uint8 array."""
        length = t.nbytes - start if length is None else length
        if start < 0 or length < 0 or start + length > t.nbytes:
            raise ValueError(f"{t.name}: byte range {start}+{length} outside {t.nbytes}")
        out = np.empty(length, dtype=np.uint8)

        def ended_early(position: int) -> SourceError:
            return SourceError(f"{t.file}: ended early at byte {position} while reading {t.name!r}; re-download it")

        pread_into(self._fd(t.file), memoryview(out), t.offset + start, ended_early)
        return out

    def iter_chunks(self, t: ByteRange, chunk_bytes: int = CHUNK_BYTES) -> Iterator[np.ndarray]:
        """The bytes of `t` in fresh chunks of at most `chunk_bytes` (bounded memory)."""
        for start in range(0, t.nbytes, chunk_bytes):
            yield self.read_bytes(t, start, min(chunk_bytes, t.nbytes - start))
