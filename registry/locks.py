"""Advisory file locks (``fcntl.flock``) with a timeout, re-entrant within one thread.

flock locks belong to an open file description, so two opens of one lock file conflict even in
the same process. That would make a thread deadlock on a lock it already holds; to avoid it, a
thread that asks again for a lock it holds (same path, same or weaker mode) just gets a nested
hold on the same descriptor. Asking for an exclusive lock while holding only a shared one is
refused with `RuntimeError` (it could never be granted while we wait).

When a lock cannot be had in time, `LockTimeoutError` names what was locked and the processes
holding it, read from ``/proc/locks`` (Linux).
"""

from __future__ import annotations

import fcntl
import logging
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from .errors import LockTimeoutError

log = logging.getLogger(__name__)

_POLL_MIN_S = 0.005
_POLL_MAX_S = 0.1
_LOG_AFTER_S = 1.0


@dataclass
class _Hold:
    fd: int
    shared: bool
    depth: int


# keyed by (pid, thread, path): the pid keeps a forked child from inheriting its parent's holds
_holds: dict[tuple[int, int, str], _Hold] = {}
_holds_guard = threading.Lock()


def holds_lock(path: Path, *, shared_ok: bool = True) -> bool:
    """Whether the calling thread holds the lock on `path` (any mode, or only exclusive)."""
    hold = _holds.get((os.getpid(), threading.get_ident(), str(path)))
    return hold is not None and (shared_ok or not hold.shared)


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid exists (it may belong to another user)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def process_label(pid: int) -> str:
    """``pid 1234 (ft pull qwen3)`` or just ``pid 1234`` if its command line is unreadable."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return f"pid {pid}"
    cmd = " ".join(part.decode(errors="replace") for part in raw.split(b"\0") if part)
    if len(cmd) > 120:
        cmd = cmd[:117] + "..."
    return f"pid {pid} ({cmd})" if cmd else f"pid {pid}"


def lock_holders(path: Path) -> list[int]:
    """Pids holding a flock on `path`, from ``/proc/locks``; empty when unknown."""
    try:
        st = os.stat(path)
        text = Path("/proc/locks").read_text()
    except OSError:
        return []
    key = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    pids: list[int] = []
    for line in text.splitlines():
        fields = line.split()
        # "1: FLOCK  ADVISORY  WRITE 1234 08:01:5678 0 EOF"; blocked waiters have a "->" field
        if "->" in fields or len(fields) < 6 or fields[1] != "FLOCK" or fields[5] != key:
            continue
        try:
            pids.append(int(fields[4]))
        except ValueError:
            continue
    return sorted(set(pids))


def _describe_holders(path: Path) -> str:
    pids = [pid for pid in lock_holders(path) if pid != os.getpid()]
    if not pids:
        return "another process (or another thread of this one)"
    return ", ".join(process_label(pid) for pid in pids)


def _acquire(fd: int, path: Path, shared: bool, timeout_s: float | None, what: str) -> None:
    mode = fcntl.LOCK_SH if shared else fcntl.LOCK_EX
    start = time.monotonic()
    delay = _POLL_MIN_S
    logged = False
    while True:
        try:
            fcntl.flock(fd, mode | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            pass
        waited = time.monotonic() - start
        if timeout_s is not None and waited >= timeout_s:
            raise LockTimeoutError(what, timeout_s, _describe_holders(path))
        if not logged and waited >= _LOG_AFTER_S:
            # (a warning: a second `ft pull` of a model being pulled waits, for hours maybe, and must say why)
            log.warning("waiting for the lock on %s, held by %s", what, _describe_holders(path))
            logged = True
        pause = delay if timeout_s is None else min(delay, max(timeout_s - waited, 0.0))
        time.sleep(pause)
        delay = min(delay * 2, _POLL_MAX_S)


@contextmanager
def file_lock(path: Path, *, shared: bool = False, timeout_s: float | None = 60.0,
              what: str | None = None, blocking: bool = True) -> Iterator[bool]:
    """Hold a flock on `path` (created if needed) for the ``with`` block.

    `timeout_s` None waits forever. With ``blocking=False`` the lock is tried once and the block
    runs with False as its value when it is busy (True when held); otherwise it yields True or
    raises `LockTimeoutError`. `what` names the locked object in messages.
    """
    path = Path(path)
    what = what or str(path)
    key = (os.getpid(), threading.get_ident(), str(path))
    hold = _holds.get(key)
    if hold is not None:
        if hold.shared and not shared:
            raise RuntimeError(f"cannot take an exclusive lock on {what} while holding a shared one")
        hold.depth += 1
        try:
            yield True
        finally:
            hold.depth -= 1
        return

    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        try:
            _acquire(fd, path, shared, timeout_s if blocking else 0.0, what)
        except LockTimeoutError:
            if blocking:
                raise
            yield False
            return
        with _holds_guard:
            _holds[key] = _Hold(fd=fd, shared=shared, depth=1)
        try:
            yield True
        finally:
            with _holds_guard:
                del _holds[key]
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
