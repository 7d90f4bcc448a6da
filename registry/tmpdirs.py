"""Per-process work directories under ``tmp/`` and cleanup after processes that died.

A work directory is named ``<prefix>-pid<pid>-<token>`` and holds an exclusive `flock` on its
``.owner.lock`` for as long as its process lives: it is stale once that lock can be taken, which
is how a process killed in the middle of a conversion gets cleaned up by the next one. The lock,
not the pid, decides: processes in other pid namespaces (containers sharing FT_HOME) see each
other's pids as absent, and a container's pull runs as pid 1, which every other process sees as
alive. Atomic-write temp files (``.<target>.tmp-<pid>-<token>``) are locked the same way, by an
exclusive `flock` their writer holds from creating them until their rename: one nobody holds is
removed at once when its pid does not run here (a writer killed with SIGKILL mid-write), or, when
that pid runs (reused by another process), once it has not been written to for
STALE_TEMP_FILE_S. A held one is never removed, whatever its pid or age.
"""

from __future__ import annotations

import fcntl
import logging
import os
import re
import secrets
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from .atomic import TEMP_MARKER
from .locks import pid_alive

log = logging.getLogger(__name__)

_PREFIX_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,63}")
_WORKDIR_RE = re.compile(r".+-pid([0-9]+)-[0-9a-f]+")
_TEMPFILE_RE = re.compile(r"\..+" + re.escape(TEMP_MARKER) + r"([0-9]+)-[0-9a-f]+")
_STAGING_RE = re.compile(r"\..+-[0-9a-f]+\.new")
OWNER_LOCK = ".owner.lock"
STALE_TEMP_FILE_S = 600.0  # an unlocked temp file untouched this long is a dead writer's even if its pid runs


@contextmanager
def temp_dir(tmp_root: Path, prefix: str = "work") -> Iterator[Path]:
    """Create a fresh work directory in `tmp_root`, locked as this process's while the block
    runs; it is removed when the block exits, error or not."""
    if not _PREFIX_RE.fullmatch(prefix):
        raise ValueError(f"temp dir prefix {prefix!r} must match {_PREFIX_RE.pattern}")
    tmp_root.mkdir(parents=True, exist_ok=True)
    token = secrets.token_hex(4)
    staging = tmp_root / f".{prefix}-{token}.new"  # locked before it takes a name cleanup looks at
    staging.mkdir()
    fd = os.open(staging / OWNER_LOCK, os.O_CREAT | os.O_RDWR, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        path = tmp_root / f"{prefix}-pid{os.getpid()}-{token}"
        os.rename(staging, path)
        try:
            yield path
        finally:
            shutil.rmtree(path, ignore_errors=True)
    finally:
        os.close(fd)  # the lock goes with it
        shutil.rmtree(staging, ignore_errors=True)  # (only if the rename never happened)


def _owner_gone(workdir: Path, pid: int) -> bool:
    """Whether no process holds `workdir`'s lock (or, in a directory from before the lock, runs
    as its pid)."""
    try:
        fd = os.open(workdir / OWNER_LOCK, os.O_RDWR)
    except FileNotFoundError:
        return not pid_alive(pid)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)  # (a lock taken here is released with it: nobody owns the directory)
    return True


def _remove(path: Path) -> bool:
    try:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()
    except FileNotFoundError:
        return False
    except OSError as exc:
        log.warning("could not remove stale %s: %s", path, exc)
        return False
    log.info("removed %s left behind by a process that is gone", path)
    return True


def cleanup_stale(tmp_root: Path, temp_file_dirs: list[Path]) -> list[Path]:
    """Remove work dirs in `tmp_root` and atomic-write temp files under `temp_file_dirs`
    (searched recursively) whose owning process is no longer running. Returns what was removed.
    """
    removed: list[Path] = []
    now = time.time()
    if tmp_root.is_dir():
        for entry in sorted(tmp_root.iterdir()):
            m = _WORKDIR_RE.fullmatch(entry.name)
            if m and entry.is_dir() and _owner_gone(entry, int(m.group(1))) and _remove(entry):
                removed.append(entry)
            elif _STAGING_RE.fullmatch(entry.name) and _untouched_for(entry, STALE_TEMP_FILE_S, now) and _remove(entry):
                removed.append(entry)
    for top in temp_file_dirs:
        if not top.is_dir():
            continue
        for dirpath, _dirnames, filenames in os.walk(top):
            for fname in filenames:
                m = _TEMPFILE_RE.fullmatch(fname)
                path = Path(dirpath) / fname
                if m and _remove_temp_file_if_stale(path, int(m.group(1)), now):
                    removed.append(path)
                    _prune_empty(path.parent, top)
    return removed


def _prune_empty(directory: Path, top: Path) -> None:
    """Remove `directory` and its parents below `top` while they are empty (a model directory a
    killed first write left; a writer that loses its directory meanwhile makes it again,
    Store.write_manifest)."""
    while directory != top and top in directory.parents:
        try:
            directory.rmdir()
        except OSError:  # not empty, or gone
            return
        directory = directory.parent


def _remove_temp_file_if_stale(path: Path, pid: int, now: float) -> bool:
    """Remove the atomic-write temp file `path` (named with its writer's `pid`) if its writer is
    gone: nobody holds its lock, and the pid does not run here or the file is STALE_TEMP_FILE_S
    old (pid reuse). The lock is held while it is unlinked, so a writer that opened the file just
    now sees it gone and takes a new one (registry.atomic)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return False
    except OSError:  # unreadable (another user's): the pid and age rules alone decide
        fd = None
    try:
        if fd is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False  # its writer is alive, in this pid namespace or another
            except OSError:  # a filesystem without flock
                pass
        if pid_alive(pid) and not _untouched_for(path, STALE_TEMP_FILE_S, now):
            return False
        return _remove(path)
    finally:
        if fd is not None:
            os.close(fd)


def _untouched_for(path: Path, seconds: float, now: float) -> bool:
    try:
        return now - path.stat().st_mtime > seconds
    except OSError:
        return False
