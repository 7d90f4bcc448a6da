"""kill -9 during `ft rm`, `ft cp`, `ft create` (a Modelfile) and the server's `/api/pull`, `/api/delete`
and `/api/copy` leaves
the store in its old state or its new one, never half: no listed model misses a blob, `ft verify`
passes on every listed model, the next command cleans up the dead process's temp files and
succeeds. Deterministic: the command runs under KILL_AT, which SIGKILLs it at the n-th pass of a
named point of the store's write path (what a power cut or the OOM killer can do anywhere)."""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from registry import Store
from tests import store_fixtures
from tests.clirun import ft
from tests.test_server_util import free_port

pulled, home = store_fixtures.pulled, store_fixtures.home  # the shared store fixtures

# The points: a manifest's bytes in its temp file before the rename (manifest-unrenamed) or just
# after it (manifest-renamed); a manifest unlinked, before its directory is synced (manifest-unlinked);
# a blob stored (blob-stored) or removed by gc (blob-removed).
KILL_AT = textwrap.dedent("""
    import os, signal, sys
    point, nth = sys.argv[1], int(sys.argv[2])
    passes = [0]
    def reached(name):
        if name == point:
            passes[0] += 1
            if passes[0] == nth:
                os.kill(os.getpid(), signal.SIGKILL)
    import registry.atomic as atomic, registry.blobs as blobs, registry.store as store
    real_commit, real_add_file, real_add_bytes, real_remove, real_fsync_dir = (
        atomic.AtomicWriter.commit, blobs.BlobStore.add_file, blobs.BlobStore.add_bytes, blobs.BlobStore.remove,
        store.fsync_dir)
    def commit(self):
        manifest = "manifests" in self.target.parts
        if manifest:
            self.file.flush()
            reached("manifest-unrenamed")
        real_commit(self)
        if manifest:
            reached("manifest-renamed")
    def add_file(self, *args, **kwargs):
        ref = real_add_file(self, *args, **kwargs)
        reached("blob-stored")
        return ref
    def add_bytes(self, *args, **kwargs):
        ref = real_add_bytes(self, *args, **kwargs)
        reached("blob-stored")
        return ref
    def remove(self, digest):
        removed = real_remove(self, digest)
        reached("blob-removed")
        return removed
    def fsync_dir(path):
        if "manifests" in path.parts:
            reached("manifest-unlinked")  # (Store.remove syncs the directory right after the unlink)
        real_fsync_dir(path)
    atomic.AtomicWriter.commit, blobs.BlobStore.add_file, blobs.BlobStore.add_bytes = commit, add_file, add_bytes
    blobs.BlobStore.remove, store.fsync_dir = remove, fsync_dir
    from ftpull.cli import _run
    _run(sys.argv[3:])
""")
KILL_TIMEOUT_S = 60  # (an unkilled command is a failure, not a hang)


def _killed_at(point: str, nth: int, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", KILL_AT, point, str(nth), *args], env=os.environ.copy(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _run_killed(point: str, nth: int, *args: str) -> None:
    proc = _killed_at(point, nth, *args)
    _, err = proc.communicate(timeout=KILL_TIMEOUT_S)
    assert proc.returncode == -signal.SIGKILL, f"`ft {' '.join(args)}` did not reach {point} #{nth}: {err}"


def _temp_files(home: Path) -> list[Path]:
    return [p for p in (home / "manifests").rglob(".*")] + [p for p in (home / "blobs").glob(".*")] + \
        list((home / "tmp").iterdir())


def _listed(home: Path, capsys: pytest.CaptureFixture[str]) -> list[str]:
    """`ft list` (the next command: it must succeed and clean up) and the models it lists, each
    of which must verify; no manifest may be skipped as unreadable."""
    code, out, err = ft(capsys, "list")
    assert code == 0 and "skipped" not in err, err
    assert _temp_files(home) == []  # the dead process's temp files and work dirs are gone
    names = [line.split()[0] for line in out.splitlines()[1:]]
    for name in names:
        code, _, err = ft(capsys, "verify", name)
        assert code == 0, (name, err)
    return names


@pytest.mark.parametrize("point, nth", [("manifest-unlinked", 1), ("blob-removed", 1), ("blob-removed", 4)])
def test_rm_killed(home: Path, capsys: pytest.CaptureFixture[str], point: str, nth: int) -> None:
    _run_killed(point, nth, "rm", "tiny")
    assert _listed(home, capsys) == []  # killed after the unlink: gone (before it, it would still verify)
    code, _, err = ft(capsys, "pull", "tiny")
    assert code == 0, err
    assert _listed(home, capsys) == ["tiny:latest"]
    assert Store(home).unreferenced_bytes() == 0  # what the dead gc left went with the next one


def test_rm_killed_before_it_removes_anything_keeps_the_model(home: Path, capsys: pytest.CaptureFixture[str],
                                                                tmp_path: Path) -> None:
    modelfile = tmp_path / "Modelfile"
    modelfile.write_text('FROM tiny\nSYSTEM "terse"\n')
    assert ft(capsys, "create", "mine", "-f", str(modelfile))[0] == 0
    _run_killed("manifest-unlinked", 1, "rm", "tiny", "mine")  # dies at the first: mine is left whole
    assert _listed(home, capsys) == ["mine:latest"]
    code, _, err = ft(capsys, "rm", "mine")
    assert code == 0, err
    assert _listed(home, capsys) == [] and Store(home).unreferenced_bytes() == 0


@pytest.mark.parametrize("point", ["manifest-unrenamed", "manifest-renamed"])
def test_cp_killed(home: Path, capsys: pytest.CaptureFixture[str], point: str) -> None:
    _run_killed(point, 1, "cp", "tiny", "twin")
    listed = _listed(home, capsys)
    assert listed == (["tiny:latest", "twin:latest"] if point == "manifest-renamed" else ["tiny:latest"])
    code, _, err = ft(capsys, "cp", "tiny", "twin")
    assert code == 0, err
    assert _listed(home, capsys) == ["tiny:latest", "twin:latest"]


@pytest.mark.parametrize("point, nth", [("blob-stored", 1), ("blob-stored", 2), ("manifest-unrenamed", 1),
                                        ("manifest-renamed", 1)])
def test_create_killed(home: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path, point: str,
                       nth: int) -> None:
    modelfile = tmp_path / "Modelfile"
    modelfile.write_text('FROM tiny\nSYSTEM "terse"\nPARAMETER temperature 0.5\nTEMPLATE "{{ messages[-1].content }}"\n')
    _run_killed(point, nth, "create", "mine", "-f", str(modelfile))
    listed = _listed(home, capsys)
    assert listed == (["mine:latest", "tiny:latest"] if point == "manifest-renamed" else ["tiny:latest"])
    code, _, err = ft(capsys, "create", "mine", "-f", str(modelfile))
    assert code == 0, err
    assert _listed(home, capsys) == ["mine:latest", "tiny:latest"]
    code, out, _ = ft(capsys, "show", "mine", "--system")
    assert code == 0 and "terse" in out


# ---- the server's /api/pull ------------------------------------------------------------------------

def _wait_for_server(port: int, proc: subprocess.Popen[str], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"ft serve exited: {proc.communicate()[1]}")
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
            conn.request("GET", "/api/version")
            if conn.getresponse().status == 200:
                return
        except OSError:
            time.sleep(0.05)
    raise AssertionError("ft serve did not start")


def _pull_until_the_server_dies(port: int) -> list[str]:
    """POST /api/pull (streamed) and read what comes until the connection drops."""
    statuses: list[str] = []
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=KILL_TIMEOUT_S)
    try:
        conn.request("POST", "/api/pull", body=json.dumps({"model": "tiny", "stream": True}),
                     headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        for raw in response:
            statuses.append(json.loads(raw).get("status", ""))
    except (http.client.HTTPException, OSError, ValueError):
        pass  # the server died mid-reply
    finally:
        conn.close()
    return statuses


@pytest.mark.parametrize("point, nth", [("blob-stored", 2), ("manifest-unrenamed", 1), ("manifest-renamed", 1)])
def test_server_pull_killed(tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
                            point: str, nth: int) -> None:
    home = tmp_path / "ft_home"
    port = free_port()
    monkeypatch.setenv("FT_HOME", str(home))
    monkeypatch.setenv("FT_HOST", f"127.0.0.1:{port}")
    proc = _killed_at(point, nth, "serve", "--device", "cpu")
    try:
        _wait_for_server(port, proc)
        statuses = _pull_until_the_server_dies(port)
        proc.wait(timeout=KILL_TIMEOUT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()
    assert proc.returncode == -signal.SIGKILL, statuses
    assert "success" not in statuses
    assert _temp_files(home)  # the dead pull's work dir (and its manifest's temp file) are still there
    monkeypatch.setenv("FT_HOST", f"127.0.0.1:{free_port()}")  # the dead server's port: nobody there now
    assert _listed(home, capsys) == (["tiny:latest"] if point == "manifest-renamed" else [])
    code, out, err = ft(capsys, "pull", "tiny")
    assert code == 0, err
    assert _listed(home, capsys) == ["tiny:latest"] and Store(home).unreferenced_bytes() == 0


# ---- the server's /api/delete and /api/copy ------------------------------------------------------

def _request_until_the_server_dies(port: int, method: str, path: str, body: dict) -> int | None:
    """One request; its status, or None where the server died before it answered."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=KILL_TIMEOUT_S)
    try:
        conn.request(method, path, body=json.dumps(body), headers={"Content-Type": "application/json"})
        return conn.getresponse().status
    except (http.client.HTTPException, OSError):
        return None
    finally:
        conn.close()


def _serve_killed_during(home: Path, monkeypatch: pytest.MonkeyPatch, point: str, nth: int, method: str, path: str,
                         body: dict) -> None:
    port = free_port()
    monkeypatch.setenv("FT_HOST", f"127.0.0.1:{port}")
    proc = _killed_at(point, nth, "serve", "--device", "cpu")
    try:
        _wait_for_server(port, proc)
        status = _request_until_the_server_dies(port, method, path, body)
        proc.wait(timeout=KILL_TIMEOUT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()
    assert proc.returncode == -signal.SIGKILL and status is None, status
    monkeypatch.setenv("FT_HOST", f"127.0.0.1:{free_port()}")  # the dead server's port: nobody there now


@pytest.mark.parametrize("point, nth", [("manifest-unlinked", 1), ("blob-removed", 1), ("blob-removed", 3)])
def test_server_delete_killed(home: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
                              point: str, nth: int) -> None:
    """Killed after the manifest's unlink: the model is gone, whole blobs or not; the next gc
    takes what the dead one left."""
    _serve_killed_during(home, monkeypatch, point, nth, "DELETE", "/api/delete", {"model": "tiny"})
    assert _listed(home, capsys) == []
    code, _, err = ft(capsys, "pull", "tiny")
    assert code == 0, err
    assert _listed(home, capsys) == ["tiny:latest"] and Store(home).unreferenced_bytes() == 0


@pytest.mark.parametrize("point", ["manifest-unrenamed", "manifest-renamed"])
def test_server_copy_killed(home: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
                            point: str) -> None:
    _serve_killed_during(home, monkeypatch, point, 1, "POST", "/api/copy", {"source": "tiny", "destination": "twin"})
    listed = _listed(home, capsys)
    assert listed == (["tiny:latest", "twin:latest"] if point == "manifest-renamed" else ["tiny:latest"])
    code, _, err = ft(capsys, "cp", "tiny", "twin")
    assert code == 0, err
    assert _listed(home, capsys) == ["tiny:latest", "twin:latest"]
