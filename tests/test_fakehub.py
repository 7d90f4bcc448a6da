"""The fake Hub is faithful enough for the real huggingface_hub client: every test drives the real client."""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import time
import urllib.error
import urllib.request
from pathlib import Path

import huggingface_hub
import pytest
import torch
from huggingface_hub import HfApi, constants, file_download, hf_hub_download, snapshot_download
from huggingface_hub.errors import EntryNotFoundError, RepositoryNotFoundError, RevisionNotFoundError
from safetensors.torch import save_file

from tests.fakehub import git_blob_sha1, skip_client_backoff

MiB = 1024 * 1024
CHUNK = getattr(constants, "DOWNLOAD_CHUNK_SIZE", 10 * MiB)  # http_get writes the body in chunks of this size
# http_get(_nb_retries=5): one attempt, then up to 5 resumes after a transient error that brought no new bytes
ATTEMPTS = inspect.signature(file_download.http_get).parameters["_nb_retries"].default + 1
# huggingface_hub >= 1.0 downloads with httpx (2.x: httpx2); 0.x with requests, whose failure handling differs
HTTPX_CLIENT = int(huggingface_hub.__version__.split(".")[0]) >= 1


def _write(root: Path, files: dict[str, bytes | str]) -> Path:
    for name, content in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content.encode() if isinstance(content, str) else content)
    return root


def _read(path: str | Path) -> bytes:
    return Path(path).read_bytes()


def _exception_names(exc: BaseException | None) -> set[str]:
    """Class names (MRO included) of an exception and of its cause/context chain."""
    names: set[str] = set()
    while exc is not None:
        names.update(cls.__name__ for cls in type(exc).__mro__)
        exc = exc.__cause__ or exc.__context__
    return names


@pytest.fixture
def repo_dir(tmp_path: Path) -> Path:
    return _write(
        tmp_path / "repo",
        {
            "config.json": json.dumps({"model_type": "llama", "architectures": ["LlamaForCausalLM"]}),
            "tokenizer.json": json.dumps({"version": "1.0"}),
            "README.md": "# tiny\n",
            "weights.bin": os.urandom(300_000),
            "extra/notes.txt": "not a weight",
        },
    )


@pytest.fixture
def big_file(tmp_path: Path) -> bytes:
    """More than one download chunk (10 MiB): a drop after the first chunk leaves something to resume from."""
    return os.urandom(CHUNK + 2 * MiB + 123)


# ---------------------------------------------------------------------------------------------- downloads


def test_hf_hub_download_regular_and_lfs_files(fake_hub, repo_dir):
    commit = fake_hub.add_repo("org/tiny", repo_dir)
    assert len(commit) == 40 and fake_hub.add_repo("org/tiny", repo_dir) == commit  # deterministic

    config = hf_hub_download("org/tiny", "config.json")
    weights = hf_hub_download("org/tiny", "weights.bin")
    assert _read(config) == _read(repo_dir / "config.json")
    assert _read(weights) == _read(repo_dir / "weights.bin")

    # cache layout: snapshots/<commit>/<file> -> blobs/<etag>; etag = git sha1 (regular) or sha256 (LFS)
    storage = fake_hub.cache_dir / "models--org--tiny"
    assert Path(config).parent.name == commit
    assert (storage / "refs" / "main").read_text() == commit
    assert Path(config).resolve().name == git_blob_sha1(_read(repo_dir / "config.json"))
    assert Path(weights).resolve().name == hashlib.sha256(_read(repo_dir / "weights.bin")).hexdigest()

    # the regular file comes from /resolve; the LFS file is a 302 to the second ("CDN") origin, as on the Hub
    lfs_sha = hashlib.sha256(_read(repo_dir / "weights.bin")).hexdigest()
    assert fake_hub.requests == [
        ("HEAD", "/org/tiny/resolve/main/config.json", None),
        ("GET", "/org/tiny/resolve/main/config.json", None),
        ("HEAD", "/org/tiny/resolve/main/weights.bin", None),
        ("GET", f"/cdn/{lfs_sha}/weights.bin", None),
    ]
    assert [r.origin for r in fake_hub.log] == ["hub", "hub", "hub", "cdn"]
    assert fake_hub.log[2].status == 302

    # cached now: a second call only revalidates with a HEAD
    fake_hub.clear_log()
    assert hf_hub_download("org/tiny", "weights.bin") == weights
    assert [r.method for r in fake_hub.log] == ["HEAD"]


@pytest.mark.parametrize("fake_hub", [{"lfs_redirect": False}], indirect=True)
def test_hf_hub_download_without_redirects_and_by_commit_or_branch(fake_hub, repo_dir, tmp_path):
    commit = fake_hub.add_repo("solo", repo_dir)  # repo ids without a namespace work too
    other = _write(tmp_path / "v2", {"config.json": '{"model_type": "mistral"}'})
    commit2 = fake_hub.add_repo("solo", other, revision="v2")
    assert commit2 != commit

    path = hf_hub_download("solo", "weights.bin", revision=commit)
    assert _read(path) == _read(repo_dir / "weights.bin")
    assert hf_hub_download("solo", "config.json", revision="v2", local_dir=tmp_path / "out").endswith(
        "config.json"
    )
    assert _read(tmp_path / "out" / "config.json") == b'{"model_type": "mistral"}'
    assert all(r.origin == "hub" for r in fake_hub.log)
    assert ("GET", f"/solo/resolve/{commit}/weights.bin", None) in fake_hub.requests

    with pytest.raises(RevisionNotFoundError):
        hf_hub_download("solo", "config.json", revision="no-such-branch")


def test_snapshot_download_fetches_only_matching_files(fake_hub, repo_dir):
    commit = fake_hub.add_repo("org/tiny", repo_dir)

    folder = snapshot_download("org/tiny", allow_patterns=["*.json"])

    assert Path(folder).name == commit
    assert sorted(p.name for p in Path(folder).iterdir()) == ["config.json", "tokenizer.json"]
    assert fake_hub.downloaded_files() == {"config.json", "tokenizer.json"}
    assert not [r for r in fake_hub.requests if "weights.bin" in r.path or "README" in r.path]
    # repo_info to resolve the branch, then (huggingface_hub >= 1.x) the recursive tree listing at that commit;
    # 0.x lists the files from repo_info's siblings instead
    api_calls = [r for r in fake_hub.log if r.path.startswith("/api/")]
    assert api_calls[0].path == "/api/models/org/tiny/revision/main"
    assert all(r.path == f"/api/models/org/tiny/tree/{commit}" for r in api_calls[1:])
    assert all("recursive=true" in r.query.lower() for r in api_calls[1:])

    # the rest of the repo later: only the missing files are fetched
    fake_hub.clear_log()
    folder = snapshot_download("org/tiny")
    assert fake_hub.downloaded_files() == {"README.md", "weights.bin", "extra/notes.txt"}
    assert _read(Path(folder) / "extra" / "notes.txt") == b"not a weight"


@pytest.mark.parametrize("fake_hub", [{"tree_page_size": 2}], indirect=True)
def test_tree_listing_is_paginated_like_the_hub(fake_hub, repo_dir):
    fake_hub.add_repo("org/tiny", repo_dir)
    folder = snapshot_download("org/tiny")
    assert sorted(str(p.relative_to(folder)) for p in Path(folder).rglob("*") if p.is_file()) == sorted(
        ["README.md", "config.json", "tokenizer.json", "weights.bin", "extra/notes.txt"]
    )
    fake_hub.clear_log()
    listing = {f.path for f in HfApi().list_repo_tree("org/tiny", recursive=True)}
    assert listing == {
        "README.md",
        "config.json",
        "tokenizer.json",
        "weights.bin",
        "extra",
        "extra/notes.txt",
    }
    tree_pages = [r for r in fake_hub.log if "/tree/" in r.path]
    assert len(tree_pages) == 3  # 6 entries, 2 per page, followed through "Link: <...>; rel=next"

    top = {f.path for f in HfApi().list_repo_tree("org/tiny")}
    assert top == {"README.md", "config.json", "tokenizer.json", "weights.bin", "extra"}
    infos = HfApi().get_paths_info("org/tiny", ["config.json", "extra", "missing.txt"])
    assert sorted((i.path, type(i).__name__) for i in infos) == [
        ("config.json", "RepoFile"),
        ("extra", "RepoFolder"),
    ]
    assert [b.name for b in HfApi().list_repo_refs("org/tiny").branches] == ["main"]


def test_model_info_siblings_and_metadata(fake_hub, repo_dir):
    commit = fake_hub.add_repo("org/tiny", repo_dir)

    info = HfApi().model_info("org/tiny")
    assert info.id == "org/tiny" and info.sha == commit
    assert sorted(s.rfilename for s in info.siblings) == sorted(
        ["README.md", "config.json", "tokenizer.json", "weights.bin", "extra/notes.txt"]
    )
    assert info.config == {"model_type": "llama", "architectures": ["LlamaForCausalLM"]}

    detailed = huggingface_hub.model_info(
        "org/tiny", revision=commit, files_metadata=True
    )  # module-level api
    sizes = {s.rfilename: (s.size, s.lfs.sha256 if s.lfs else None) for s in detailed.siblings}
    weights = _read(repo_dir / "weights.bin")
    assert sizes["weights.bin"] == (len(weights), hashlib.sha256(weights).hexdigest())
    assert sizes["config.json"] == ((repo_dir / "config.json").stat().st_size, None)
    assert ("GET", f"/api/models/org/tiny/revision/{commit}", None) in fake_hub.requests

    with pytest.raises(RevisionNotFoundError):
        HfApi().model_info("org/tiny", revision="nope")


# ---------------------------------------------------------------------------------------------- safetensors


def test_get_safetensors_metadata_single_file(fake_hub, tmp_path):
    # enough tensors that the header (> 100 kB) needs the client's second Range request
    tensors = {f"model.layers.{i}.mlp.experts.{i}.gate_proj.weight": torch.zeros(2, 3) for i in range(2000)}
    tensors["lm_head.weight"] = torch.zeros(8, 4, dtype=torch.bfloat16)
    repo = tmp_path / "single"
    repo.mkdir()
    save_file(tensors, str(repo / "model.safetensors"), metadata={"format": "pt"})
    header_len = int.from_bytes(_read(repo / "model.safetensors")[:8], "little")
    assert header_len > 100_000
    fake_hub.add_repo("org/single", repo)

    meta = HfApi().get_safetensors_metadata("org/single")

    assert not meta.sharded
    file_meta = meta.files_metadata["model.safetensors"]
    assert file_meta.metadata == {"format": "pt"}
    assert file_meta.tensors["lm_head.weight"].dtype == "BF16"
    assert file_meta.tensors["lm_head.weight"].shape == [8, 4]
    assert meta.parameter_count == {"F32": 2000 * 6, "BF16": 32}
    ranges = [r.range for r in fake_hub.requests_for("model.safetensors")]
    assert ranges == ["bytes=0-100000", f"bytes=8-{header_len + 7}"]  # no full download
    # model_info carries the parameter counts too, as on the Hub
    assert HfApi().model_info("org/single").safetensors.parameters == {"F32": 12000, "BF16": 32}


def test_get_safetensors_metadata_sharded(fake_hub, tmp_path):
    repo = tmp_path / "sharded"
    repo.mkdir()
    shards = {
        "model-00001-of-00002.safetensors": {
            "embed.weight": torch.zeros(10, 4),
            "layer.0.w": torch.zeros(4, 4),
        },
        "model-00002-of-00002.safetensors": {"layer.1.w": torch.zeros(4, 4, dtype=torch.float16)},
    }
    weight_map = {}
    for name, tensors in shards.items():
        save_file(tensors, str(repo / name))
        weight_map.update(dict.fromkeys(tensors, name))
    index = {"metadata": {"total_size": 40 * 4 + 16 * 4 + 16 * 2}, "weight_map": weight_map}
    (repo / "model.safetensors.index.json").write_text(json.dumps(index))
    fake_hub.add_repo("org/sharded", repo)

    meta = huggingface_hub.get_safetensors_metadata("org/sharded")  # module-level api

    assert meta.sharded
    assert meta.metadata == index["metadata"]
    assert meta.weight_map == weight_map
    assert set(meta.files_metadata) == set(shards)
    assert meta.files_metadata["model-00002-of-00002.safetensors"].tensors["layer.1.w"].dtype == "F16"
    assert meta.parameter_count == {"F32": 56, "F16": 16}
    # the shards are only read through Range requests; the index is downloaded
    assert fake_hub.downloaded_files() == {"model.safetensors.index.json", *shards}
    for shard in shards:
        assert [r.range for r in fake_hub.requests_for(shard)] == ["bytes=0-100000"]
        assert all(r.status == 206 for r in fake_hub.requests_for(shard))


# ---------------------------------------------------------------------------------------------- dropped connections


@pytest.mark.parametrize(
    "after_bytes",
    [1000, CHUNK + MiB],
    ids=["drop-inside-first-chunk", "drop-after-first-chunk"],
)
def test_dropped_connection_is_resumed(fake_hub, tmp_path, big_file, monkeypatch, after_bytes):
    """A body cut short (FIN mid-body). The client keeps what it has written to disk, which is whole chunks of
    DOWNLOAD_CHUNK_SIZE (10 MiB): the partial chunk in flight is lost with the connection. So a drop inside the first
    10 MiB restarts from byte 0 without Range, a later one resumes with ``Range: bytes=<whole chunks>-``.

    huggingface_hub >= 1 (httpx): http_get catches the RemoteProtocolError and resumes inside the same call.
    huggingface_hub 0.x (requests): the call raises ChunkedEncodingError, leaving ``<etag>.incomplete`` in the cache;
    the next call resumes from it.
    """
    skip_client_backoff(monkeypatch)
    fake_hub.add_repo("org/big", _write(tmp_path / "big", {"model.safetensors": big_file}))
    fake_hub.fail_next("model.safetensors", after_bytes=after_bytes)
    resumed_from = (after_bytes // CHUNK) * CHUNK

    if HTTPX_CLIENT:
        path = hf_hub_download("org/big", "model.safetensors")
    else:
        with pytest.raises(Exception, match="IncompleteRead|Connection broken"):
            hf_hub_download("org/big", "model.safetensors")
        partial = list((fake_hub.cache_dir / "models--org--big" / "blobs").glob("*.incomplete"))
        assert [p.stat().st_size for p in partial] == [resumed_from]
        path = hf_hub_download("org/big", "model.safetensors")

    assert _read(path) == big_file
    first, second = fake_hub.requests_for("model.safetensors")
    assert (first.range, first.fault, first.body_bytes) == (None, "dropped", after_bytes)
    if resumed_from == 0:
        assert (second.range, second.status, second.body_bytes) == (None, 200, len(big_file))
    else:
        assert (second.range, second.status) == (f"bytes={resumed_from}-", 206)
        assert second.body_bytes == len(big_file) - resumed_from


@pytest.mark.skipif(
    not HTTPX_CLIENT, reason="0.x fails on the first drop: see test_dropped_connection_is_resumed"
)
@pytest.mark.parametrize("mode", ["reset", "close"])
def test_failed_download_then_second_call_succeeds(fake_hub, tmp_path, big_file, monkeypatch, mode):
    """huggingface_hub >= 1: a download that fails for good leaves no partial file behind (each attempt writes a
    process-unique temp file, deleted on failure), so the next hf_hub_download starts again from byte 0, no Range.

    - "reset" (TCP RST -> httpx ReadError): not retried at all, the first call fails at once.
    - "close" (FIN mid-body -> RemoteProtocolError): resumed up to ATTEMPTS - 1 times; the call fails once a
      retry brings no new byte.
    """
    skip_client_backoff(monkeypatch)
    fake_hub.add_repo("org/big", _write(tmp_path / "big", {"model.safetensors": big_file}))
    fake_hub.fail_next("model.safetensors", after_bytes=CHUNK + MiB, mode=mode)
    if mode == "close":
        fake_hub.fail_next("model.safetensors", after_bytes=0, times=ATTEMPTS - 1)

    with pytest.raises(Exception) as excinfo:
        hf_hub_download("org/big", "model.safetensors")
    names = _exception_names(excinfo.value)
    assert ("ReadError" if mode == "reset" else "RemoteProtocolError") in names
    failed = fake_hub.requests_for("model.safetensors")
    assert len(failed) == (1 if mode == "reset" else ATTEMPTS)
    if mode == "close":  # the retries resumed after the first whole chunk
        assert {r.range for r in failed[1:]} == {f"bytes={CHUNK}-"}
    blobs = fake_hub.cache_dir / "models--org--big" / "blobs"
    assert (list(blobs.glob("*")) if blobs.exists() else []) == []

    fake_hub.clear_log()
    path = hf_hub_download("org/big", "model.safetensors")

    assert _read(path) == big_file
    (retry,) = fake_hub.requests_for("model.safetensors")
    assert (retry.range, retry.status, retry.body_bytes) == (None, 200, len(big_file))


# ---------------------------------------------------------------------------------------------- errors


def test_unknown_repo_and_unknown_file(fake_hub, repo_dir):
    commit = fake_hub.add_repo("org/tiny", repo_dir)

    with pytest.raises(RepositoryNotFoundError):
        hf_hub_download("org/missing", "config.json")
    with pytest.raises(RepositoryNotFoundError):
        HfApi().model_info("org/missing")
    with pytest.raises(RepositoryNotFoundError):
        snapshot_download("org/missing")
    with pytest.raises(EntryNotFoundError):
        hf_hub_download("org/tiny", "missing.json")

    # the 404 carried X-Repo-Commit, so the client cached the file's absence at that commit
    assert (fake_hub.cache_dir / "models--org--tiny" / ".no_exist" / commit / "missing.json").exists()
    assert not HfApi().file_exists("org/tiny", "missing.json")
    assert HfApi().file_exists("org/tiny", "config.json")


def test_range_semantics_of_the_server(fake_hub, repo_dir):
    """Plain HTTP checks of what a resuming downloader (the product's own code) would see."""
    fake_hub.add_repo("org/tiny", repo_dir, revision="main")
    data = _read(repo_dir / "tokenizer.json")
    url = f"{fake_hub.endpoint}/org/tiny/resolve/main/tokenizer.json"

    def get(range_header: str | None) -> tuple[int, dict[str, str], bytes]:
        req = urllib.request.Request(url, headers={"Range": range_header} if range_header else {})
        try:
            with urllib.request.urlopen(req, timeout=5) as resp:
                return resp.status, dict(resp.headers), resp.read()
        except urllib.error.HTTPError as err:
            return err.code, dict(err.headers), err.read()

    status, headers, body = get(None)
    assert (status, body, headers["Accept-Ranges"]) == (200, data, "bytes")
    assert headers["ETag"] == f'"{git_blob_sha1(data)}"' and len(headers["X-Repo-Commit"]) == 40
    status, headers, body = get("bytes=5-")
    assert (status, body, headers["Content-Range"]) == (206, data[5:], f"bytes 5-{len(data) - 1}/{len(data)}")
    status, headers, body = get("bytes=-3")
    assert (status, body) == (206, data[-3:])
    status, headers, _ = get(f"bytes={len(data)}-")
    assert (status, headers["Content-Range"]) == (416, f"bytes */{len(data)}")

    # a fault can hit a plain client too: headers, N bytes, then the socket closes
    fake_hub.fail_next("tokenizer.json", after_bytes=4)
    with pytest.raises(Exception) as excinfo:
        get(None)
    assert "IncompleteRead" in _exception_names(excinfo.value)


# ---------------------------------------------------------------------------------------------- timeouts


def test_download_timeout_raises_instead_of_hanging(fake_hub, repo_dir, monkeypatch):
    """constants.HF_HUB_DOWNLOAD_TIMEOUT (read on each call; the env var only at import) bounds every read of the
    GET. A stalled GET is retried ATTEMPTS times (1 s apart, skipped here), then the timeout is raised."""
    skip_client_backoff(monkeypatch)
    monkeypatch.setattr(constants, "HF_HUB_DOWNLOAD_TIMEOUT", 0.2)
    fake_hub.add_repo("org/tiny", repo_dir)
    fake_hub.delay("weights.bin", 30)  # every GET of it, until the hub stops

    start = time.monotonic()
    with pytest.raises(Exception) as excinfo:
        hf_hub_download("org/tiny", "weights.bin")
    elapsed = time.monotonic() - start

    assert "ReadTimeout" in _exception_names(excinfo.value)
    assert elapsed < 5
    stalled = fake_hub.requests_for("weights.bin", method=None, content_only=False)
    assert [r.method for r in stalled] == ["HEAD"] + ["GET"] * ATTEMPTS
    assert all(r.fault == "delayed" for r in stalled[1:])


def test_stall_mid_body_is_detected_and_resumed(fake_hub, tmp_path, big_file, monkeypatch):
    skip_client_backoff(monkeypatch)
    monkeypatch.setattr(constants, "HF_HUB_DOWNLOAD_TIMEOUT", 0.2)
    fake_hub.add_repo("org/big", _write(tmp_path / "big", {"model.safetensors": big_file}))
    fake_hub.delay("model.safetensors", 30, times=1, after_bytes=CHUNK + 1)

    path = hf_hub_download("org/big", "model.safetensors")

    assert _read(path) == big_file
    first, second = fake_hub.requests_for("model.safetensors")
    assert (first.fault, first.body_bytes) == ("delayed", CHUNK + 1)
    assert second.range == f"bytes={CHUNK}-"


@pytest.mark.parametrize("knob", ["etag_timeout-argument", "HF_HUB_ETAG_TIMEOUT-constant"])
def test_metadata_timeout_is_retried_with_a_longer_timeout(fake_hub, repo_dir, monkeypatch, knob):
    """A HEAD slower than etag_timeout fails fast; with no cached copy the client then retries the HEAD with its own
    60 s timeout (and back-off), so only a short stall is survivable quickly. A non-default
    constants.HF_HUB_ETAG_TIMEOUT overrides the etag_timeout argument."""
    fake_hub.add_repo("org/tiny", repo_dir)
    fake_hub.delay("config.json", 3, times=1, methods=["HEAD"])
    kwargs = {}
    if knob.startswith("etag_timeout"):
        kwargs["etag_timeout"] = 0.2
    else:
        monkeypatch.setattr(constants, "HF_HUB_ETAG_TIMEOUT", 0.2)

    start = time.monotonic()
    path = hf_hub_download("org/tiny", "config.json", **kwargs)

    assert time.monotonic() - start < 2
    assert _read(path) == _read(repo_dir / "config.json")
    heads = fake_hub.requests_for("config.json", method="HEAD", content_only=False)
    assert [r.fault for r in heads] == ["delayed", None]


def test_api_timeout_argument(fake_hub, repo_dir):
    fake_hub.add_repo("org/tiny", repo_dir)
    fake_hub.delay_api(30)

    start = time.monotonic()
    with pytest.raises(Exception) as excinfo:
        HfApi().model_info("org/tiny", timeout=0.2)

    assert "ReadTimeout" in _exception_names(excinfo.value)
    assert time.monotonic() - start < 2
    assert len(fake_hub.requests) == 1  # model_info does not retry
