"""Registry across processes: model locks, pull sessions against gc, stale temp cleanup."""

from __future__ import annotations

import multiprocessing as mp
import os
import threading
import time
from pathlib import Path

import pytest

from registry import Descriptor, LockTimeoutError, Manifest, Store, digest_bytes
from registry.tmpdirs import STALE_TEMP_FILE_S

# spawn: children start clean instead of inheriting the parent's open lock descriptors
CTX = mp.get_context("spawn")
CHILD_START_S = 30.0


def _hold_model_lock(root: str, name: str, held, release) -> None:
    store = Store(Path(root))
    with store.lock(name, timeout_s=5):
        held.set()
        release.wait(30)


def _hold_pull_session(root: str, held, release) -> None:
    store = Store(Path(root))
    with store.pull_session(), store.lock("pulling:1"):
        store.add_blob_bytes(b"blob of a pull in progress")
        held.set()
        release.wait(30)


def _noop() -> None:
    pass


def _start(target, *args):
    held, release = CTX.Event(), CTX.Event()
    proc = CTX.Process(target=target, args=(*args, held, release), daemon=True)
    proc.start()
    assert held.wait(CHILD_START_S), "child process did not take its lock"
    return proc, release


def test_second_process_times_out_then_gets_the_lock(tmp_path: Path) -> None:
    store = Store(tmp_path)
    proc, release = _start(_hold_model_lock, str(tmp_path), "qwen3:30b")
    try:
        t0 = time.monotonic()
        with pytest.raises(LockTimeoutError) as info, store.lock("qwen3:30b", timeout_s=0.3):
            pass
        assert time.monotonic() - t0 >= 0.3
        msg = str(info.value)
        assert "qwen3:30b" in msg and f"pid {proc.pid}" in msg

        # another model is not blocked
        with store.lock("other", timeout_s=0.3) as held:
            assert held

        # a waiter gets the lock as soon as the holder lets go
        threading.Timer(0.3, release.set).start()
        t0 = time.monotonic()
        with store.lock("qwen3:30b", timeout_s=20):
            waited = time.monotonic() - t0
        assert 0.2 <= waited < 20
    finally:
        release.set()
        proc.join(10)
    assert proc.exitcode == 0


def test_lock_is_reentrant_in_one_thread_but_excludes_other_threads(tmp_path: Path) -> None:
    store = Store(tmp_path)
    with store.lock("m"), store.lock("parse_me:latest"):
        with store.lock("ft.local/library/m:latest", timeout_s=0.1):
            pass  # same thread, same model: no deadlock
        outcome: list[str] = []

        def other_thread() -> None:
            try:
                with store.lock("m", timeout_s=0.2):
                    outcome.append("got it")
            except LockTimeoutError:
                outcome.append("timed out")

        t = threading.Thread(target=other_thread)
        t.start()
        t.join()
        assert outcome == ["timed out"]
    with store.lock("m", timeout_s=0.1):
        pass


def test_gc_waits_for_a_pull_session_in_another_process(tmp_path: Path) -> None:
    store = Store(tmp_path)
    orphan = store.add_blob_bytes(b"left by a crashed pull")
    proc, release = _start(_hold_pull_session, str(tmp_path))
    in_progress = digest_bytes(b"blob of a pull in progress")
    try:
        assert store.has_blob(in_progress)
        assert store.gc(wait=False) == []  # skipped, not blocked
        with pytest.raises(LockTimeoutError, match=f"pid {proc.pid}"):
            store.gc(timeout_s=0.3)
        assert store.has_blob(in_progress) and store.has_blob(orphan.digest)
        # remove() while a pull runs: the manifest goes, its blobs wait for a later gc
        store.add_blob_bytes(b"cfg")
        cfg = Descriptor("application/json", digest_bytes(b"cfg"), 3)
        store.write_manifest("victim", Manifest(config=cfg, layers=[]))
        assert store.remove("victim") == []
        assert store.has_blob(cfg.digest)

        # a blocking gc proceeds once the pull session ends
        threading.Timer(0.3, release.set).start()
        removed = store.gc(timeout_s=20)
    finally:
        release.set()
        proc.join(10)
    assert proc.exitcode == 0
    # the child never wrote its manifest, so its blob is an orphan by now too
    assert sorted(removed) == sorted([orphan.digest, in_progress, cfg.digest])


def test_gc_inside_own_pull_session(tmp_path: Path) -> None:
    store = Store(tmp_path)
    store.add_blob_bytes(b"new")
    with store.pull_session():
        assert store.gc(wait=False) == []
        with pytest.raises(RuntimeError, match="pull_session"):
            store.gc()
    assert store.gc() == [digest_bytes(b"new")]


def test_cleanup_stale_removes_dead_pids_only(tmp_path: Path) -> None:
    store = Store(tmp_path)
    proc = CTX.Process(target=_noop)
    proc.start()
    proc.join(30)
    dead = proc.pid
    assert dead is not None and proc.exitcode == 0

    dead_dir = store.tmp_dir / f"convert-pid{dead}-deadbeef"
    (dead_dir / "sub").mkdir(parents=True)
    (dead_dir / "sub" / "half-written.ftw").write_bytes(b"x" * 100)
    dead_blob_tmp = store.blobs_dir / f".sha256-{'0' * 64}.tmp-{dead}-abcd1234"
    dead_blob_tmp.write_bytes(b"partial")
    manifest_dir = store.manifests_dir / "ft.local" / "library" / "m"
    manifest_dir.mkdir(parents=True)
    dead_manifest_tmp = manifest_dir / f".latest.tmp-{dead}-00ff00ff"
    dead_manifest_tmp.write_bytes(b"{")
    live_blob_tmp = store.blobs_dir / f".sha256-{'1' * 64}.tmp-{os.getpid()}-abcd1234"
    live_blob_tmp.write_bytes(b"in progress")
    young_tmp = store.blobs_dir / f".sha256-{'2' * 64}.tmp-{dead}-abcd1234"  # a dead pid's: no age needed
    young_tmp.write_bytes(b"half written")
    old = time.time() - 2 * STALE_TEMP_FILE_S
    for path in (dead_blob_tmp, dead_manifest_tmp):
        os.utime(path, (old, old))
    unrelated = store.tmp_dir / "notes"
    unrelated.mkdir()

    with store.temp_dir("convert") as live_dir:
        (live_dir / "f").write_bytes(b"busy")
        removed = store.cleanup_stale()
        assert sorted(removed) == sorted([dead_dir, dead_blob_tmp, dead_manifest_tmp, young_tmp])
        assert live_dir.is_dir() and (live_dir / "f").exists()
        assert f"pid{os.getpid()}" in live_dir.name
    assert not live_dir.exists()
    assert live_blob_tmp.exists() and unrelated.exists()  # a live pid's (young: not a reused pid's)
    os.utime(live_blob_tmp, (old, old))  # a live pid's file untouched for long and unlocked: the pid was reused
    assert store.cleanup_stale() == [live_blob_tmp]


def _write_manifest_and_die(root: str, held) -> None:  # type: ignore[no-untyped-def]
    """Start writing a manifest the way Store.write_manifest does, then die by SIGKILL mid-write."""
    import signal

    from registry import AtomicWriter

    path = Store(Path(root)).manifest_path("victim")
    path.parent.mkdir(parents=True, exist_ok=True)
    writer = AtomicWriter(path)
    writer.write(b'{"schemaVersion": 2, "half')
    writer.file.flush()
    held.put(str(writer.temp_path))
    held.close()
    held.join_thread()  # (the queue's feeder thread has sent it: SIGKILL spares nothing)
    os.kill(os.getpid(), signal.SIGKILL)


def test_a_manifest_writer_killed_mid_write_is_cleaned_up_at_once(tmp_path: Path) -> None:
    """kill -9 while a manifest is written leaves `.latest.tmp-<pid>-<token>`; its pid is gone, so
    the next cleanup removes it at once (no 600 s wait), and the model's directory can go too."""
    store = Store(tmp_path)
    held = CTX.Queue()
    proc = CTX.Process(target=_write_manifest_and_die, args=(str(tmp_path), held))
    proc.start()
    temp = Path(held.get(timeout=CHILD_START_S))
    proc.join(30)
    assert proc.exitcode == -9  # SIGKILL
    assert temp.exists() and temp.parent == store.manifest_path("victim").parent
    assert temp.name.startswith(".latest.tmp-") and f"-{proc.pid}-" in temp.name
    assert store.cleanup_stale() == [temp]
    assert not temp.exists() and store.list_models() == []
    assert list(store.manifests_dir.iterdir()) == []  # the directories its first write made, pruned


def _hold_temp_file(root: str, made, release) -> None:  # type: ignore[no-untyped-def]
    from registry import AtomicWriter

    with AtomicWriter(Store(Path(root)).manifest_path("busy")) as f:
        f.write(b"{")
        f.flush()
        made.put(str(next(Store(Path(root)).manifest_path("busy").parent.glob(".latest.tmp-*"))))
        release.wait(30)


def test_a_temp_file_being_written_is_never_removed(tmp_path: Path) -> None:
    """A writer holds its temp file's lock: even named with a pid that does not run here (a writer
    in another pid namespace sharing FT_HOME) and old, its file is kept until it is renamed."""
    store = Store(tmp_path)
    store.manifest_path("busy").parent.mkdir(parents=True)
    made, release = CTX.Queue(), CTX.Event()
    proc = CTX.Process(target=_hold_temp_file, args=(str(tmp_path), made, release))
    proc.start()
    try:
        temp = Path(made.get(timeout=CHILD_START_S))
        elsewhere = temp.with_name(".latest.tmp-999999999-0badf00d")  # as another namespace's pid reads here
        temp.rename(elsewhere)
        old = time.time() - 2 * STALE_TEMP_FILE_S
        os.utime(elsewhere, (old, old))
        assert store.cleanup_stale() == []
        assert elsewhere.exists()
    finally:
        release.set()
        proc.join(30)
    assert proc.exitcode != 0  # (its rename found the temp file under another name: the write failed, loudly)
    assert store.cleanup_stale() == [elsewhere]  # its writer is gone now


def _hold_work_dir(root: str, made, release) -> None:  # type: ignore[no-untyped-def]
    with Store(Path(root)).temp_dir("pull") as path:
        made.put(str(path))
        release.wait(30)


def test_a_work_dir_is_stale_by_its_lock_not_its_pid(tmp_path: Path) -> None:
    """Containers sharing FT_HOME see each other's pids as absent, and a container's pull runs as
    pid 1, which every other process sees as alive: a held work dir named with a pid that does
    not run here is kept, and an abandoned one named with a live pid is removed."""
    store = Store(tmp_path)
    made, release = CTX.Queue(), CTX.Event()
    proc = CTX.Process(target=_hold_work_dir, args=(str(tmp_path), made, release))
    proc.start()
    try:
        held = Path(made.get(timeout=30))
        elsewhere = held.with_name("pull-pid999999999-0badf00d")  # as another namespace's pid reads here
        held.rename(elsewhere)
        abandoned = store.tmp_dir / "pull-pid1-feedface"  # a killed container's pull
        abandoned.mkdir()
        (abandoned / ".owner.lock").touch()
        assert store.cleanup_stale() == [abandoned]
        assert elsewhere.is_dir()
    finally:
        release.set()
        proc.join(30)
    assert store.cleanup_stale() == [elsewhere]  # its owner is gone now (under the name it was renamed to)


def test_temp_dir_removed_on_exception(tmp_path: Path) -> None:
    store = Store(tmp_path)
    with pytest.raises(ValueError, match="boom"), store.temp_dir("pull") as work:
        (work / "a").write_bytes(b"1")
        raise ValueError("boom")
    assert not work.exists()
    assert list(store.tmp_dir.iterdir()) == []
    with pytest.raises(ValueError), store.temp_dir("../escape"):
        pass
