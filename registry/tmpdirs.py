"""Per-process work directories under ``tmp/`` and cleanup after processes that died.

A work directory is named ``<prefix>-pid<pid>-<token>``; atomic-write temp files are named
``.<target>.tmp-<pid>-<token>``. Either is stale once its pid no longer runs, which is how a
process killed in the middle of a conversion gets cleaned up by the next one.
"""

from __future__ import annotations

import logging
import os
import re
import secrets
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from .atomic import TEMP_MARKER
from .locks import pid_alive

log = logging.getLogger(__name__)

_PREFIX_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,63}")
_WORKDIR_RE = re.compile(r".+-pid([0-9]+)-[0-9a-f]+")
_TEMPFILE_RE = re.compile(r"\..+" + re.escape(TEMP_MARKER) + r"([0-9]+)-[0-9a-f]+")


@contextmanager
def temp_dir(tmp_root: Path, prefix: str = "work") -> Iterator[Path]:
    """Create a fresh work directory in `tmp_root`; it is removed when the block exits, error or not."""
    if not _PREFIX_RE.fullmatch(prefix):
        raise ValueError(f"temp dir prefix {prefix!r} must match {_PREFIX_RE.pattern}")
    tmp_root.mkdir(parents=True, exist_ok=True)
    path = tmp_root / f"{prefix}-pid{os.getpid()}-{secrets.token_hex(4)}"
    path.mkdir()
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


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
    if tmp_root.is_dir():
        for entry in sorted(tmp_root.iterdir()):
            m = _WORKDIR_RE.fullmatch(entry.name)
            if m and not pid_alive(int(m.group(1))) and _remove(entry):
                removed.append(entry)
    for top in temp_file_dirs:
        if not top.is_dir():
            continue
        for dirpath, _dirnames, filenames in os.walk(top):
            for fname in filenames:
                m = _TEMPFILE_RE.fullmatch(fname)
                if m and not pid_alive(int(m.group(1))):
                    path = Path(dirpath) / fname
                    if _remove(path):
                        removed.append(path)
    return removed
