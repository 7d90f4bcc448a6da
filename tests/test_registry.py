"""Registry: name grammar, manifests, crash-safe writes, blobs, gc, list/remove/copy, verify."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest

import registry.atomic as atomic_mod
from registry import (
    ANNOTATION_TITLE,
    AtomicWriter,
    CorruptManifestError,
    Descriptor,
    DigestMismatchError,
    InvalidDigestError,
    InvalidNameError,
    Manifest,
    MissingBlobError,
    ModelName,
    ModelNotFoundError,
    RegistryError,
    Store,
    atomic_write_bytes,
    digest_bytes,
    parse_name,
)

# ---- names ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "canonical", "display"),
    [
        ("qwen3", "ft.local/library/qwen3:latest", "qwen3:latest"),
        ("qwen3:30b", "ft.local/library/qwen3:30b", "qwen3:30b"),
        ("Qwen3:30B-A3B", "ft.local/library/qwen3:30b-a3b", "qwen3:30b-a3b"),
        ("myteam/glm-5.2", "ft.local/myteam/glm-5.2:latest", "myteam/glm-5.2:latest"),
        ("hub.example.com/acme/mix_tral:v1.0", "hub.example.com/acme/mix_tral:v1.0",
         "hub.example.com/acme/mix_tral:v1.0"),
        ("localhost:5000/a/b:_x", "localhost:5000/a/b:_x", "localhost:5000/a/b:_x"),
        ("FT.LOCAL/Library/M", "ft.local/library/m:latest", "m:latest"),
    ],
)
def test_parse_name_defaults_and_forms(text: str, canonical: str, display: str) -> None:
    name = parse_name(text)
    assert str(name) == canonical
    assert name.display == display
    assert parse_name(str(name)) == name
    assert parse_name(name.display) == name


@pytest.mark.parametrize(
    "text",
    [
        "../x", "a/../../b", "/etc/passwd", "x:../y", "..", ".", "a/..", "../../etc/passwd:latest",
        "a\\b", "..\\..\\x", "a\x00b", "qwen3:lat\x00est", "a//b", "a/", "/", "", "  ", ":tag",
        "model:", "a:b:c", ".hidden", "ns/.hidden", "m:.tag", "m:..", "m:a..b", "a..b",
        "host/ns/m/extra", "a/b/c/d:e", "m" * 129, "m:" + "t" * 129, "x" * 600, "has space",
        "-lead", "ns/-m", "ho_st/ns/m", "host:port/ns/m", "m:t/x", "m:ta@g", "~/m", "$HOME",
        # look-alikes that lower() or NFKC would fold into ASCII, and control characters
        "\u212aelvin", "m:\u212a", "\uff54\uff49\uff4e\uff59", "t\u0131ny", "\u0130/m", "tiny\u200b", "a\x01b",
        "a\x7fb", "a\x85b", "m:t\x1b",
    ],
)
def test_parse_name_rejects_traversal_and_junk(text: str) -> None:
    with pytest.raises(InvalidNameError) as info:
        parse_name(text)
    msg = str(info.value)
    assert "expected [host/][namespace/]model[:tag]" in msg
    assert isinstance(info.value, RegistryError)


def test_invalid_name_message_names_the_part() -> None:
    with pytest.raises(InvalidNameError, match=r"namespace '\.\.'"):
        parse_name("../x")
    with pytest.raises(InvalidNameError, match=r"tag '\.\./y'|namespace 'x:\.\.'"):
        parse_name("x:../y")
    with pytest.raises(InvalidNameError, match="NUL"):
        parse_name("a\x00b")
    with pytest.raises(InvalidNameError, match="absolute"):
        parse_name("/etc/passwd")
    with pytest.raises(InvalidNameError, match=r"non-ASCII character .* \(U\+212A KELVIN SIGN\); names are ASCII only"):
        parse_name("\u212aelvin")  # ("kelvin" once it is lower-cased: checked before)
    with pytest.raises(InvalidNameError, match=r"control character U\+0001"):
        parse_name("a\x01b")


def test_control_characters_are_refused_in_paths_too() -> None:
    from registry.names import refuse_control_characters

    refuse_control_characters("./mod\u00e8le")  # a path may be non-ASCII
    with pytest.raises(InvalidNameError, match="NUL"):
        refuse_control_characters("../\x00x")


def test_model_name_constructor_validates() -> None:
    with pytest.raises(InvalidNameError):
        ModelName("ft.local", "library", "..", "latest")
    with pytest.raises(InvalidNameError):
        ModelName("ft.local", "library", "m", "a/b")
    with pytest.raises(InvalidNameError):
        ModelName("ft.local", "Library", "m", "latest")  # not lower-cased


def test_manifest_paths_stay_inside_store(tmp_path: Path) -> None:
    store = Store(tmp_path)
    for text in ["a", "ns/a:b", "h.x:80/ns/a:B"]:
        path = store.manifest_path(text).resolve()
        assert store.manifests_dir.resolve() in path.parents
        assert len(path.relative_to(store.manifests_dir.resolve()).parts) == 4


# ---- manifests -------------------------------------------------------------------------------


def _desc(data: bytes, title: str, media: str = "application/octet-stream") -> Descriptor:
    return Descriptor(media, digest_bytes(data), len(data), {ANNOTATION_TITLE: title})


def _put_model(store: Store, name: str, blobs: dict[str, bytes]) -> Manifest:
    """Store `blobs` (title -> bytes) and a manifest whose config is the first of them."""
    descs = []
    for title, data in blobs.items():
        store.add_blob_bytes(data)
        descs.append(_desc(data, title))
    manifest = Manifest(config=descs[0], layers=descs[1:])
    store.write_manifest(name, manifest)
    return manifest


def test_manifest_json_round_trip() -> None:
    m = Manifest(
        config=_desc(b"{}", "config", "application/vnd.ft.config+json"),
        layers=[_desc(b"a" * 10, "shard-0.ftw"), Descriptor("x/y", digest_bytes(b"b"), 1)],
    )
    back = Manifest.from_json(m.to_json())
    assert back == m
    assert back.to_json() == m.to_json()
    assert back.layers[1].annotations == {}
    assert back.find("shard-0.ftw") == m.layers[0]
    assert m.total_size == 2 + 10 + 1


@pytest.mark.parametrize(
    ("mutate", "needle"),
    [
        (lambda o: o.update(schemaVersion=3), "schemaVersion 3"),
        (lambda o: o.update(schemaVersion="2"), "schemaVersion"),
        (lambda o: o.update(mediaType="text/plain"), "mediaType"),
        (lambda o: o.update(layers={}), "layers must be a list"),
        (lambda o: o["config"].update(digest="sha256:XYZ"), "config.digest"),
        (lambda o: o["config"].update(digest="md5:" + "0" * 64), "config.digest"),
        (lambda o: o["layers"][0].update(size=-1), "layers[0].size"),
        (lambda o: o["layers"][0].update(size=True), "layers[0].size"),
        (lambda o: o["layers"][0].update(size="10"), "layers[0].size"),
        (lambda o: o["layers"][0].update(annotations={"k": 1}), "annotations"),
        (lambda o: o["layers"].append("nope"), "layers[1] is str"),
        (lambda o: o.pop("config"), "config is NoneType"),
    ],
)
def test_manifest_from_json_rejects_bad_fields(mutate, needle: str) -> None:
    obj = Manifest(config=_desc(b"c", "config"), layers=[_desc(b"l", "l0")]).to_dict()
    mutate(obj)
    with pytest.raises(CorruptManifestError) as info:
        Manifest.from_json(json.dumps(obj), source="/some/file", name="m:latest")
    msg = str(info.value)
    assert needle in msg and "/some/file" in msg and "ft rm m:latest" in msg and "ft pull m:latest" in msg


@pytest.mark.parametrize("raw", [b"", b"{", b"[]", b"\xff\xfe", b"null", b"[" * 100000])
def test_manifest_from_json_rejects_garbage(raw: bytes) -> None:
    with pytest.raises(CorruptManifestError):
        Manifest.from_json(raw, source="f")


# ---- atomic writes ---------------------------------------------------------------------------


def test_atomic_write_replaces_and_leaves_nothing(tmp_path: Path) -> None:
    target = tmp_path / "f"
    atomic_write_bytes(target, b"one")
    atomic_write_bytes(target, b"two")
    assert target.read_bytes() == b"two"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f"]


def test_atomic_write_crash_mid_write_keeps_old_content(tmp_path: Path, monkeypatch) -> None:
    target = tmp_path / "f"
    atomic_write_bytes(target, b"old")
    with pytest.raises(RuntimeError, match="disk on fire"), AtomicWriter(target) as f:
        f.write(b"new partial")
        raise RuntimeError("disk on fire")
    assert target.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f"]

    def failing_fsync(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(atomic_mod.os, "fsync", failing_fsync)
    with pytest.raises(OSError, match="No space"):
        atomic_write_bytes(target, b"new")
    assert target.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f"]


def test_write_manifest_crash_on_rename_leaves_no_temp(tmp_path: Path, monkeypatch) -> None:
    store = Store(tmp_path)
    _put_model(store, "m", {"config": b"c1"})
    before = store.manifest_path("m").read_bytes()

    def failing_replace(src: str, dst: str) -> None:
        raise OSError(5, "I/O error")

    store.add_blob_bytes(b"c2")
    monkeypatch.setattr(atomic_mod.os, "replace", failing_replace)
    with pytest.raises(OSError, match="I/O error"):
        store.write_manifest("m", Manifest(config=_desc(b"c2", "config"), layers=[]))
    monkeypatch.undo()
    assert store.manifest_path("m").read_bytes() == before
    assert os.listdir(store.manifest_path("m").parent) == ["latest"]


# ---- blobs -----------------------------------------------------------------------------------


def test_add_blob_file_move_verify_and_dedup(tmp_path: Path) -> None:
    store = Store(tmp_path / "store")
    src = tmp_path / "shard"
    data = os.urandom(3 << 20) + b"tail"
    src.write_bytes(data)
    ref = store.add_blob_file(src, digest=digest_bytes(data))
    assert ref.digest == digest_bytes(data) and ref.size == len(data)
    assert not src.exists()
    assert store.blob_path(ref.digest).read_bytes() == data
    assert store.blob_path(ref.digest).name == "sha256-" + ref.digest[7:]

    # same content again: the verified new file takes the blob's place (a rename), none is left over
    src.write_bytes(data)
    assert store.add_blob_file(src) == ref
    assert not src.exists() and store.blob_path(ref.digest).read_bytes() == data

    # copy mode keeps the source
    other = tmp_path / "other"
    other.write_bytes(b"xyz")
    ref2 = store.add_blob_file(other, move=False)
    assert other.read_bytes() == b"xyz" and store.has_blob(ref2.digest)
    with store.open_blob(ref2.digest) as f:
        assert f.read() == b"xyz"
    assert sorted(p.name for p in store.blobs_dir.iterdir()) == sorted(  # each with its sampled digest
        store.blob_path(d).name + suffix for d in (ref.digest, ref2.digest) for suffix in ("", ".sample")
    )


def test_add_blob_file_across_filesystems_copies(tmp_path: Path, monkeypatch) -> None:
    store = Store(tmp_path / "store")
    src = tmp_path / "f"
    src.write_bytes(b"on another disk")
    real_replace = os.replace

    def replace_no_cross_device(a, b) -> None:
        if not Path(a).name.startswith("."):  # only our own temp files may be renamed
            raise OSError(errno.EXDEV, "Invalid cross-device link")
        real_replace(a, b)

    monkeypatch.setattr(os, "replace", replace_no_cross_device)
    ref = store.add_blob_file(src)
    assert not src.exists()
    assert store.blob_path(ref.digest).read_bytes() == b"on another disk"
    blob = store.blob_path(ref.digest).name
    assert sorted(p.name for p in store.blobs_dir.iterdir()) == [blob, blob + ".sample"]  # (its sampled digest)


def test_add_blob_digest_mismatch_names_both(tmp_path: Path) -> None:
    store = Store(tmp_path / "store")
    src = tmp_path / "f"
    src.write_bytes(b"actual")
    wrong = digest_bytes(b"expected")
    with pytest.raises(DigestMismatchError) as info:
        store.add_blob_file(src, digest=wrong)
    assert wrong in str(info.value) and digest_bytes(b"actual") in str(info.value)
    assert src.exists()  # left for the caller to inspect or delete
    assert list(store.blobs_dir.iterdir()) == []
    with pytest.raises(DigestMismatchError):
        store.add_blob_bytes(b"actual", digest=wrong)
    with pytest.raises(InvalidDigestError):
        store.blob_path("sha256:../../etc/passwd")


def test_add_blob_replaces_a_truncated_existing_blob(tmp_path: Path) -> None:
    store = Store(tmp_path)
    ref = store.add_blob_bytes(b"0123456789")
    store.blob_path(ref.digest).write_bytes(b"01234")
    assert store.add_blob_bytes(b"0123456789") == ref
    assert store.blob_path(ref.digest).read_bytes() == b"0123456789"


@pytest.mark.parametrize("move", [True, False])
def test_adding_a_blob_again_heals_a_stored_copy_that_rotted(tmp_path: Path, move: bool) -> None:
    """A stored blob whose bytes changed in place (same size: a bit flip) is replaced when the
    same content is added again (`ft verify` says: rm and pull again), even when another model
    shares it and it was never deleted; bytes stored in memory too."""
    store = Store(tmp_path / "store")
    data = os.urandom(1 << 20)
    src = tmp_path / "shard"
    src.write_bytes(data)
    ref = store.add_blob_file(src, move=False)
    rotted = bytearray(data)
    rotted[4096] ^= 0xFF
    store.blob_path(ref.digest).write_bytes(bytes(rotted))
    assert store.add_blob_file(src, move=move) == ref
    assert store.blob_path(ref.digest).read_bytes() == data
    small = store.add_blob_bytes(b"0123456789")
    store.blob_path(small.digest).write_bytes(b"0123456788")
    assert store.add_blob_bytes(b"0123456789") == small and store.blob_path(small.digest).read_bytes() == b"0123456789"


def test_open_missing_blob(tmp_path: Path) -> None:
    with pytest.raises(MissingBlobError):
        Store(tmp_path).open_blob(digest_bytes(b"nothing"))


# ---- manifests in the store, gc, list, remove, copy ------------------------------------------


def test_write_manifest_refuses_missing_blobs(tmp_path: Path) -> None:
    store = Store(tmp_path)
    store.add_blob_bytes(b"config")
    m = Manifest(config=_desc(b"config", "config"), layers=[_desc(b"never stored", "shard")])
    with pytest.raises(MissingBlobError) as info:
        store.write_manifest("m", m)
    assert digest_bytes(b"never stored") in str(info.value)
    assert not store.has_model("m")
    assert store.list_models() == []


def test_read_missing_model_suggests_list_and_pull(tmp_path: Path) -> None:
    with pytest.raises(ModelNotFoundError) as info:
        Store(tmp_path).read_manifest("ghost:1b")
    assert "ft list" in str(info.value) and "ft pull ghost:1b" in str(info.value)


def test_gc_keeps_shared_blobs_and_removes_orphans(tmp_path: Path) -> None:
    store = Store(tmp_path)
    _put_model(store, "a", {"config": b"cfg-a", "shared": b"shared", "only-a": b"only-a"})
    _put_model(store, "ns/b:v2", {"config": b"cfg-b", "shared": b"shared"})
    orphan = store.add_blob_bytes(b"orphan from a crashed pull")
    assert store.gc() == [orphan.digest]
    assert not store.has_blob(orphan.digest)

    removed = store.remove("a")
    assert sorted(removed) == sorted([digest_bytes(b"cfg-a"), digest_bytes(b"only-a")])
    assert store.has_blob(digest_bytes(b"shared")) and store.has_blob(digest_bytes(b"cfg-b"))
    assert not (store.manifests_dir / "ft.local" / "library").exists()  # pruned empty dirs
    assert [str(e.name) for e in store.list_models()] == ["ft.local/ns/b:v2"]

    store.remove("ns/b:v2")
    assert list(store.blobs_dir.iterdir()) == []
    assert list(store.manifests_dir.iterdir()) == []
    with pytest.raises(ModelNotFoundError):
        store.remove("ns/b:v2")


def test_list_and_copy(tmp_path: Path) -> None:
    store = Store(tmp_path)
    ma = _put_model(store, "zeta:1", {"config": b"z"})
    mb = _put_model(store, "alpha", {"config": b"a", "l": b"layer"})
    store.copy("alpha", "team/alpha-copy:x")
    entries = store.list_models()
    assert [e.name.display for e in entries] == ["alpha:latest", "zeta:1", "team/alpha-copy:x"]
    assert entries[0].manifest == mb and entries[1].manifest == ma and entries[2].manifest == mb
    assert all(e.modified_time > 0 for e in entries)
    store.remove("alpha")
    assert store.has_blob(digest_bytes(b"layer"))  # still used by the copy
    with pytest.raises(ModelNotFoundError):
        store.copy("alpha", "other")


def test_corrupt_manifest_is_skipped_not_fatal(tmp_path: Path, caplog) -> None:
    store = Store(tmp_path)
    good = _put_model(store, "good", {"config": b"good"})
    bad_blob = store.add_blob_bytes(b"blob of the damaged model")
    bad_path = store.manifest_path("broken:v1")
    bad_path.parent.mkdir(parents=True)
    bad_path.write_text('{"schemaVersion": 2, "layers": [{"digest": "' + bad_blob.digest + '"')
    stray = store.manifests_dir / "ft.local" / "README"
    stray.write_text("not a manifest")

    with caplog.at_level("WARNING", logger="registry"):
        entries = store.list_models()
    assert [(e.name.display, e.manifest) for e in entries] == [("good:latest", good)]
    assert "broken" in caplog.text and "README" in caplog.text
    _, skipped = store.scan_models()
    assert sorted(s.path for s in skipped) == sorted([bad_path, stray])
    with pytest.raises(CorruptManifestError, match="ft rm broken:v1"):
        store.read_manifest("broken:v1")
    # gc must not delete the blobs a damaged manifest still mentions
    assert store.gc() == []
    assert store.has_blob(bad_blob.digest)


# ---- verify and disk -------------------------------------------------------------------------


def test_verify_reports_missing_truncated_corrupt(tmp_path: Path) -> None:
    store = Store(tmp_path)
    blobs = {"config": b"{}", "shard-0.ftw": b"A" * 1000, "shard-1.ftw": b"B" * 1000,
             "shard-2.ftw": b"C" * 1000, "shard-3.ftw": b"D" * 1000}
    m = _put_model(store, "m", blobs)
    calls: list[tuple[int, int]] = []
    assert store.verify("m", progress=lambda done, total: calls.append((done, total))) == []
    assert calls[-1] == (m.total_size, m.total_size)

    store.blob_path(digest_bytes(b"A" * 1000)).unlink()
    store.blob_path(digest_bytes(b"B" * 1000)).write_bytes(b"B" * 10)
    store.blob_path(digest_bytes(b"C" * 1000)).write_bytes(b"C" * 999 + b"X")
    calls.clear()
    bad = {b.title: b for b in store.verify("m", progress=lambda d, t: calls.append((d, t)))}
    assert set(bad) == {"shard-0.ftw", "shard-1.ftw", "shard-2.ftw"}
    assert bad["shard-0.ftw"].problem == "missing"
    assert bad["shard-1.ftw"].problem == "truncated" and bad["shard-1.ftw"].actual_size == 10
    assert bad["shard-2.ftw"].problem == "corrupt"
    assert bad["shard-2.ftw"].actual_digest == digest_bytes(b"C" * 999 + b"X")
    for b in bad.values():
        assert b.path == store.blob_path(b.digest)
        assert b.title in str(b) and str(b.path) in str(b)
    assert calls[-1] == (m.total_size, m.total_size)
    assert [d for d, _ in calls] == sorted(d for d, _ in calls)
    # sizes and samples only (4 MiB a blob at most): the same-size corruption is seen where a sample holds it
    assert {b.title: b.problem for b in store.verify("m", rehash=False)} == {"shard-0.ftw": "missing",
                                                                          "shard-1.ftw": "truncated",
                                                                          "shard-2.ftw": "corrupt"}

    # repair: drop the bad blob and store good bytes again
    store.remove_blob(bad["shard-2.ftw"].digest)
    store.add_blob_bytes(b"C" * 1000)
    assert {b.title for b in store.verify("m")} == {"shard-0.ftw", "shard-1.ftw"}


def test_disk_free_and_default_root(tmp_path: Path, monkeypatch) -> None:
    store = Store(tmp_path)
    assert store.disk_free_bytes() > 0
    monkeypatch.setenv("FT_HOME", str(tmp_path / "home"))
    assert Store.default().root == (tmp_path / "home").absolute()
    assert (tmp_path / "home" / "blobs").is_dir()
    monkeypatch.delenv("FT_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "user"))
    assert Store.default().root == tmp_path / "user" / ".ft"
