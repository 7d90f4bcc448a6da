"""`ft pull` end to end against a local Hub, with the real huggingface_hub client, and its faults."""

from __future__ import annotations

import errno
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import huggingface_hub.constants
import pytest
import torch

from ftpull import hub
from ftpull.fetch import PullError
from ftpull.hub import HubError
from ftpull.preflight import FitError, Resources
from ftpull.pull import pull
from ftpull.resolve import ResolveError
from ftw import UnsupportedArchitectureError
from ftw.sink import DiskFullError
from registry import Store
from runtime.loading.registered import open_model
from tests.checkpoints import load_all, save_checkpoint, to_fp8
from tests.fakehub import skip_client_backoff

REPO = "Qwen/Qwen3-30B-A3B"  # the repository the shipped qwen3-30b-a3b recipe names


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Store:
    monkeypatch.setenv("FT_HOME", str(tmp_path / "ft_home"))
    monkeypatch.setenv("FT_PULL_RETRY_DELAY_S", "0")
    return Store.default()


@pytest.fixture
def qwen_repo(tmp_path: Path) -> Path:
    src = save_checkpoint("qwen3_moe", tmp_path / "repo", max_shard_size="200KB")
    (src / "tokenizer.json").write_text('{"version": "1.0"}')
    (src / "pytorch_model.bin").write_bytes(b"pickles are never downloaded")
    (src / "README.md").write_text("# a model card")
    return src


def weights_requested(hub) -> list[str]:
    """Weight files whose tensor data was requested (the fit check reads headers by small Range requests)."""
    return [r.path for r in hub.log
            if r.method == "GET" and r.path.endswith(".safetensors") and not (r.range or "").startswith("bytes=0-")]


def test_pull_shipped_name_from_hub(fake_hub, store: Store, qwen_repo: Path) -> None:
    fake_hub.add_repo(REPO, qwen_repo)
    events = []
    result = pull("qwen3-30b-a3b", store, report=events.append)
    assert not result.already_present and str(result.name) == "ft.local/library/qwen3-30b-a3b:latest"
    assert any(e.status.startswith("pulling Qwen/Qwen3-30B-A3B") and e.total for e in events)
    downloaded = fake_hub.downloaded_files()
    assert "config.json" in downloaded and "tokenizer.json" in downloaded
    assert "pytorch_model.bin" not in downloaded and "README.md" not in downloaded
    model = open_model(store, "qwen3-30b-a3b")
    assert model.config["family"] == "qwen3_moe" and model.config["revision"] == fake_hub.commit_sha(REPO)
    assert {"model.ftw.json", "tokenizer.json", "Modelfile"} <= set(model.files)
    reader = model.open_ftw()
    reader.verify()
    source = load_all(qwen_repo)
    emb = source["model.embed_tokens.weight"].to(torch.bfloat16)  # the recipe says DTYPE bf16
    assert torch.equal(reader.tensor("model.embed_tokens.weight"), emb)
    assert not (store.root / "downloads" / "hf" / REPO).exists() or not any((store.root / "downloads" / "hf" / REPO).iterdir())
    assert list(store.tmp_dir.iterdir()) == []

    fake_hub.clear_log()
    start = time.perf_counter()
    again = pull("qwen3-30b-a3b", store)
    assert again.already_present and time.perf_counter() - start < 0.5
    assert fake_hub.requests == []  # a present model costs no network at all


def test_pull_hf_uri_fp8(fake_hub, store: Store, tmp_path: Path) -> None:
    src = to_fp8(save_checkpoint("deepseek_v3", tmp_path / "hf"), tmp_path / "fp8")
    fake_hub.add_repo("deepseek-ai/DeepSeek-V3", src)
    result = pull("hf://deepseek-ai/DeepSeek-V3", store)
    assert str(result.name) == "hf.co/deepseek-ai/deepseek-v3:latest"
    model = open_model(store, "hf.co/deepseek-ai/deepseek-v3")
    assert model.open_ftw().index.banks[0].part("w13").dtype == "f8_e4m3"


def test_dropped_connection_is_resumed(fake_hub, store: Store, qwen_repo: Path, monkeypatch) -> None:
    skip_client_backoff(monkeypatch)
    fake_hub.add_repo(REPO, qwen_repo)
    shard = sorted(p.name for p in qwen_repo.glob("*.safetensors"))[0]
    fake_hub.fail_next(shard, after_bytes=50_000)
    pull(f"hf://{REPO}", store)
    ranges = [r for m, p, r in fake_hub.requests if m == "GET" and p.endswith(shard)]
    assert len(ranges) >= 2 and any(r and r.startswith("bytes=") for r in ranges[1:])
    open_model(store, f"hf.co/{REPO}").open_ftw().verify()


def test_interrupted_pull_resumes_next_time(fake_hub, store: Store, qwen_repo: Path, monkeypatch) -> None:
    skip_client_backoff(monkeypatch)
    monkeypatch.setenv("FT_PULL_RETRIES", "1")
    fake_hub.add_repo(REPO, qwen_repo)
    shard = sorted(p.name for p in qwen_repo.glob("*.safetensors"))[-1]
    download = hub.download_files

    def failing(*args: object, **kwargs: object) -> None:  # once the headers were read: the download breaks off
        fake_hub.fail_next(shard, after_bytes=30_000)  # after some bytes,
        fake_hub.fail_next(shard, after_bytes=0, times=20)  # and then the link is down
        download(*args, **kwargs)

    monkeypatch.setattr(hub, "download_files", failing)
    # the client writes whole chunks of this size (10 MB): smaller, so these small shards are written in parts
    monkeypatch.setattr(huggingface_hub.constants, "DOWNLOAD_CHUNK_SIZE", 8192)
    with pytest.raises(HubError, match="run the pull again: it resumes"):
        pull(f"hf://{REPO}", store)
    monkeypatch.setattr(hub, "download_files", download)
    assert store.list_models() == []  # nothing half-listed
    partial = list((store.root / "downloads").rglob(shard + ".part"))
    assert len(partial) == 1 and (kept := partial[0].stat().st_size) >= 16_384  # kept for the next run
    fake_hub.clear_faults()
    fake_hub.clear_log()
    pull(f"hf://{REPO}", store)
    ranges = [r for m, p, r in fake_hub.requests if m == "GET" and p.endswith(shard) and r and r.endswith("-")]
    assert ranges and int(ranges[0].removeprefix("bytes=").rstrip("-")) == kept  # picked up where it stopped
    assert not list((store.root / "downloads").rglob("*.part"))
    open_model(store, f"hf.co/{REPO}").open_ftw().verify()


def test_fit_check_refuses_before_download(fake_hub, store: Store, qwen_repo: Path, monkeypatch) -> None:
    fake_hub.add_repo(REPO, qwen_repo)
    tiny_machine = Resources(disk_free_bytes=10_000, ram_total_bytes=1 << 30, ram_available_bytes=1 << 30, has_gpu=False)
    monkeypatch.setattr(Resources, "probe", staticmethod(lambda disk_free_bytes: tiny_machine))
    with pytest.raises(FitError) as err:
        pull("qwen3-30b-a3b", store)
    message = str(err.value)
    assert "disk: needs" in message and "free" in message and "FT_HOME" in message
    assert "RAM: needs" in message and "--force" in message
    assert weights_requested(fake_hub) == []
    assert pull("qwen3-30b-a3b", store, force=True).name.model == "qwen3-30b-a3b"


def test_unknown_architecture_refused_before_download(fake_hub, store: Store, tmp_path: Path) -> None:
    src = save_checkpoint("mixtral", tmp_path / "hf")
    config = (src / "config.json").read_text().replace('"mixtral"', '"no_such_moe"')  # (dbrx is converted now)
    (src / "config.json").write_text(config)
    fake_hub.add_repo("org/no-such-moe", src)
    with pytest.raises(UnsupportedArchitectureError, match="supported families"):
        pull("hf://org/no-such-moe", store)
    assert weights_requested(fake_hub) == []


def test_a_hub_config_that_is_not_an_object_is_refused_before_download(fake_hub, store: Store, tmp_path: Path) -> None:
    """The Hub's config.json gets a local checkpoint's checks (load_config: size, JSON, an object)."""
    src = save_checkpoint("mixtral", tmp_path / "hf")
    (src / "config.json").write_text("[1, 2]")
    fake_hub.add_repo("org/odd", src)
    with pytest.raises(HubError, match="config.json is not a JSON object"):
        pull("hf://org/odd", store)
    assert weights_requested(fake_hub) == []


def test_two_names_of_one_repository_pulled_at_once_take_turns_with_its_downloads(fake_hub, store: Store,
                                                                                   qwen_repo: Path,
                                                                                   monkeypatch) -> None:
    """hf://org/repo and hf.co/org/repo:x share downloads/hf/org/repo/REV, which a pull deletes
    when done: the second waits for the first (it deleted the files under the other's conversion)."""
    import threading

    import ftw

    fake_hub.add_repo("org/repo", qwen_repo)
    real, first_converting, errors = ftw.convert_checkpoint, threading.Event(), []

    def convert(src, out, **kw):
        if threading.current_thread().name == "first":
            first_converting.set()
            time.sleep(1.5)  # the other pull, started meanwhile, would delete these files now
        return real(src, out, **kw)

    monkeypatch.setattr(ftw, "convert_checkpoint", convert)  # (ftpull.register takes it from ftw when it converts)

    def run(text: str) -> None:
        try:
            pull(text, store, force=True)
        except Exception as e:  # noqa: BLE001 - reported by the assertion below
            errors.append(e)

    first = threading.Thread(target=run, args=("hf://org/repo",), name="first")
    first.start()
    assert first_converting.wait(30)
    second = threading.Thread(target=run, args=("hf.co/org/repo:x",), name="second")
    second.start()
    first.join(60)
    second.join(60)
    assert errors == [] and len(store.list_models()) == 2


def test_a_model_removed_while_a_pull_runs_has_its_blobs_collected_when_the_pull_ends(store: Store,
                                                                                      tmp_path: Path) -> None:
    pull(str(save_checkpoint("qwen3_moe", tmp_path / "a", seed=1)), store)
    (first,) = store.list_models()
    blobs = {layer.digest for layer in store.read_manifest(first.name).layers}
    with store.pull_session():  # another pull is running: ft rm's gc is skipped
        store.remove(first.name)
    assert all(store.has_blob(d) for d in blobs)
    pull(str(save_checkpoint("mixtral", tmp_path / "b", seed=2)), store)
    assert not any(store.has_blob(d) for d in blobs)


def test_unknown_repository(fake_hub, store: Store) -> None:
    with pytest.raises(HubError, match="does not exist or needs access"):
        pull("hf://nobody/nothing", store)


def test_disk_full_during_conversion_leaves_nothing(store: Store, tmp_path: Path, monkeypatch) -> None:
    import errno

    src = save_checkpoint("mixtral", tmp_path / "hf")
    real_write = os.write
    left = {"bytes": 100_000}

    def write(fd: int, data) -> int:
        left["bytes"] -= len(data)
        if left["bytes"] < 0:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(fd, data)

    monkeypatch.setattr("ftw.sink.os.write", write)
    with pytest.raises(DiskFullError, match="disk full .* free some space or point FT_HOME"):
        pull(str(src), store)
    assert store.list_models() == [] and list(store.tmp_dir.iterdir()) == []
    assert list(store.blobs_dir.iterdir()) == []


KILL_DURING_CONVERSION = textwrap.dedent("""
    import os, signal, sys
    import ftw.convert as convert
    real = convert._Converter.write_bank
    def write_bank(self, layer, src):
        if layer >= 1:
            os.kill(os.getpid(), signal.SIGKILL)
        return real(self, layer, src)
    convert._Converter.write_bank = write_bank
    from ftpull.cli import _run
    _run(["pull", sys.argv[1]])
""")


def test_killed_conversion_is_cleaned_up_by_next_pull(store: Store, tmp_path: Path) -> None:
    src = save_checkpoint("mixtral", tmp_path / "hf")
    proc = subprocess.run([sys.executable, "-c", KILL_DURING_CONVERSION, str(src)], env=os.environ.copy(),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL
    assert store.list_models() == []
    assert any(store.tmp_dir.iterdir())  # the dead process's work dir
    pull(str(src), store)
    assert [e.name.model for e in store.list_models()] == ["hf"]
    assert list(store.tmp_dir.iterdir()) == []


def test_concurrent_pulls_of_one_model(store: Store, tmp_path: Path) -> None:
    src = save_checkpoint("qwen3_moe", tmp_path / "hf")
    cmd = [sys.executable, "-m", "ftpull", "pull", str(src)]
    procs = [subprocess.Popen(cmd, env=os.environ.copy(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(3)]
    outputs = [p.communicate(timeout=180) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], outputs
    assert sum("pulled" in out for out, _ in outputs) == 1  # the others waited, then found it present
    assert len(store.list_models()) == 1
    assert store.verify("local/hf") == []


def test_verify_names_corrupt_and_truncated_shards(store: Store, tmp_path: Path) -> None:
    src = save_checkpoint("mixtral", tmp_path / "hf")
    pull(str(src), store)
    model = open_model(store, "local/hf")
    shard = model.files["model-00001.ftw"]
    shard.chmod(0o644)
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x01
    shard.write_bytes(bytes(data))
    bad = store.verify("local/hf")
    assert [(b.title, b.problem) for b in bad] == [("model-00001.ftw", "corrupt")]
    shard.write_bytes(bytes(data[:-4096]))
    bad = store.verify("local/hf")
    assert [(b.title, b.problem) for b in bad] == [("model-00001.ftw", "truncated")]


def test_local_directory_with_missing_files(store: Store, tmp_path: Path) -> None:
    src = save_checkpoint("mixtral", tmp_path / "hf")
    shutil.rmtree(src / "model.safetensors", ignore_errors=True)
    (src / "model.safetensors").unlink(missing_ok=True)
    from ftw import SourceError

    with pytest.raises(SourceError, match="no \\*.safetensors files"):
        pull(str(src), store)
    assert store.list_models() == []


def test_pull_gguf_recipe_from_hub(fake_hub, store: Store, tmp_path: Path) -> None:
    from tests.test_ftw_gguf import tiny_qwen3_moe_tensors, write_gguf

    repo = tmp_path / "gguf-repo"
    repo.mkdir()
    write_gguf(repo / "Qwen3-30B-A3B-Q4_K_M.gguf", tiny_qwen3_moe_tensors())
    (repo / "Qwen3-30B-A3B-Q8_0.gguf").write_bytes(b"another quant, not needed")
    fake_hub.add_repo("Qwen/Qwen3-30B-A3B-GGUF", repo)
    result = pull("qwen3-30b-a3b:q4_k_m", store)  # the shipped recipe's gguf:// source
    assert str(result.name) == "ft.local/library/qwen3-30b-a3b:q4_k_m"
    assert "Qwen3-30B-A3B-Q8_0.gguf" not in fake_hub.downloaded_files()
    model = open_model(store, "qwen3-30b-a3b:q4_k_m")
    assert model.config["family"] == "qwen3_moe" and model.config["dtype"] in ("q4_k", "q8_0", "q6_k")
    assert {"tokenizer.json", "tokenizer_config.json"} <= set(model.files)
    reader = model.open_ftw()
    assert reader.index.banks[0].part("w13").dtype == "q4_k"
    reader.verify()


def test_an_hf_co_name_with_a_quant_tag_pulls_that_gguf_file(fake_hub, store: Store, tmp_path: Path) -> None:
    """hf.co/org/repo:Q4_K_M, as Ollama reads it: the repository's .gguf file of that quant (the tag
    named only the local copy, and a GGUF-only repository failed for want of a config.json)."""
    from tests.test_ftw_gguf import tiny_qwen3_moe_tensors, write_gguf

    repo = tmp_path / "gguf-repo"
    repo.mkdir()
    write_gguf(repo / "Tiny-MoE-Q4_K_M.gguf", tiny_qwen3_moe_tensors())
    (repo / "Tiny-MoE-IQ4_K_M.gguf").write_bytes(b"a quant whose name holds the other's")
    (repo / "Tiny-MoE-Q8_0.gguf").write_bytes(b"another quant, not needed")
    fake_hub.add_repo("org/tiny-moe-gguf", repo)
    result = pull("hf.co/org/tiny-moe-gguf:Q4_K_M", store)
    assert str(result.name) == "hf.co/org/tiny-moe-gguf:q4_k_m"  # (names are case-insensitive, as Ollama's)
    assert fake_hub.downloaded_files() == {"Tiny-MoE-Q4_K_M.gguf"}
    assert open_model(store, result.name).open_ftw().index.banks[0].part("w13").dtype == "q4_k"
    with pytest.raises(PullError, match=r"has no .gguf file for 'q5_k_m'; it has Tiny-MoE-IQ4_K_M.gguf, "):
        pull("hf.co/org/tiny-moe-gguf:Q5_K_M", store)


def test_a_gguf_of_an_unsupported_architecture_is_refused_before_its_download(fake_hub, store: Store,
                                                                           tmp_path: Path) -> None:
    """The architecture is read from the file's first bytes: the whole file was downloaded, then
    refused, and left in downloads/ for good."""
    from tests.test_ftw_gguf import tiny_qwen3_moe_tensors, write_gguf

    repo = tmp_path / "gguf-repo"
    repo.mkdir()
    write_gguf(repo / "Gemma-Q4_K_M.gguf", tiny_qwen3_moe_tensors(), arch="gemma3")
    fake_hub.add_repo("org/gemma-gguf", repo)
    with pytest.raises(UnsupportedArchitectureError, match="GGUF architecture 'gemma3' has no converter"):
        pull("hf.co/org/gemma-gguf:Q4_K_M", store)
    gets = [r for m, p, r in fake_hub.requests if m == "GET" and p.endswith(".gguf")]
    assert gets and all(r == f"bytes=0-{(1 << 20) - 1}" for r in gets)  # its first MiB only
    assert not [p for p in (store.root / "downloads").rglob("*") if p.is_file()]


def test_pull_local_gguf_file(store: Store, tmp_path: Path) -> None:
    from tests.test_ftw_gguf import tiny_qwen3_moe_tensors, write_gguf

    path = write_gguf(tmp_path / "My-Model-Q4_K_M.gguf", tiny_qwen3_moe_tensors())
    result = pull(str(path), store)
    assert str(result.name) == "ft.local/local/my-model-q4_k_m:latest"
    assert store.verify(result.name) == []


def test_repository_without_safetensors(fake_hub, store: Store, tmp_path: Path) -> None:
    repo = tmp_path / "pickles"
    repo.mkdir()
    (repo / "config.json").write_text('{"model_type": "mixtral"}')
    (repo / "pytorch_model.bin").write_bytes(b"\x80\x04pickle")
    fake_hub.add_repo("someone/pickled", repo)
    with pytest.raises(HubError, match="no safetensors weights"):
        pull("hf://someone/pickled", store)
    assert "pytorch_model.bin" not in fake_hub.downloaded_files()


def test_a_full_disk_is_not_retried_as_a_network_error(fake_hub, store: Store, qwen_repo: Path, monkeypatch) -> None:
    """ENOSPC while downloading was retried five times from byte 0 and then blamed on the
    network; now it stops at once, names the disk, and the pull resumes later."""
    fake_hub.add_repo(REPO, qwen_repo)
    calls = []

    def full(*args: object) -> None:
        calls.append(args)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(hub, "_download_resumable", full)
    with pytest.raises(HubError, match="the disk is full .* free space on the disk that holds FT_HOME; the pull resumes"):
        pull(f"hf://{REPO}", store)
    assert len(calls) == 1


def test_an_hf_co_name_keeps_the_repositorys_case(fake_hub, store: Store, qwen_repo: Path) -> None:
    """hf.co/Org/Repo was looked up as org/repo: a mirror that matches ids case-sensitively (as
    this fake Hub does) answered RepositoryNotFound. The local name is lower case; the downloads
    of the two spellings share one directory."""
    fake_hub.add_repo(REPO, qwen_repo)
    result = pull(f"hf.co/{REPO}", store)
    assert str(result.name) == f"hf.co/{REPO.lower()}:latest"
    assert any(p.endswith("model.safetensors.index.json") or ".safetensors" in p
               for m, p, r in fake_hub.requests if m == "GET" and REPO in p)
    assert pull(f"hf.co/{REPO.lower()}", store).already_present


def test_two_local_checkpoints_of_one_directory_name_are_not_one_model(store: Store, tmp_path: Path) -> None:
    """.../run-a/checkpoint and .../run-b/checkpoint both name local/checkpoint: the second was
    reported "up to date" and `ft run` of its path loaded the first."""
    first = save_checkpoint("qwen3_moe", tmp_path / "run-a" / "checkpoint")
    second = save_checkpoint("mixtral", tmp_path / "run-b" / "checkpoint")
    assert pull(str(first), store).name.display == "local/checkpoint:latest"
    assert pull(str(first), store).already_present
    with pytest.raises(PullError, match=r"already holds the model pulled from .*run-a/checkpoint, not .*run-b"):
        pull(str(second), store)


def test_a_finished_pull_leaves_no_download_of_an_older_commit(fake_hub, store: Store, qwen_repo: Path,
                                                                monkeypatch) -> None:
    """An interrupted pull's files of one commit stayed for good once a later commit was pulled."""
    fake_hub.add_repo(REPO, qwen_repo)
    old_commit = store.root / "downloads" / "hf" / REPO.lower() / ("0" * 40)
    old_commit.mkdir(parents=True)
    (old_commit / "model-00001-of-00003.safetensors.part").write_bytes(b"x" * 1000)
    pull(f"hf://{REPO}", store)
    assert not (store.root / "downloads" / "hf" / REPO.lower()).exists()


def test_remaining_bytes_count_an_interrupted_download(store: Store) -> None:
    """The fit check asked for a whole file again beside its .part: a resume on a tight disk was
    refused unless --force turned every check off."""
    from ftpull.fetch import _remaining, downloads_of

    files = (hub.RemoteFile("a.safetensors", 1000), hub.RemoteFile("b.safetensors", 500))
    revision = downloads_of(store, "Org/Model") / ("c" * 40)
    revision.mkdir(parents=True)
    (revision / "a.safetensors.part").write_bytes(b"x" * 700)
    (revision / "b.safetensors").write_bytes(b"x" * 500)
    assert _remaining(store, "Org/Model", "c" * 40, files) == 300


def test_a_header_read_stops_where_the_server_ignores_the_range(monkeypatch) -> None:
    """A mirror that answers a ranged GET with the whole file: the GGUF pre-check read all of it
    into memory (20 GB for a 20 GB file) before slicing the first MiB off."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    size, sent = 64 << 20, []

    class WholeFile(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            self.send_response(200)  # the Range header ignored
            self.send_header("Content-Length", str(size))
            self.end_headers()
            try:
                for _ in range(size >> 20):
                    self.wfile.write(b"G" * (1 << 20))
                    sent.append(1)
            except OSError:  # the client stopped reading
                pass

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), WholeFile)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setattr(hub, "endpoint", lambda: f"http://127.0.0.1:{server.server_port}")
    try:
        assert hub.read_prefix("Org/Model-GGUF", "a" * 40, "model.gguf", 1 << 20) == b"G" * (1 << 20)
    finally:
        server.shutdown()
    assert len(sent) < 32  # far from the whole 64 MiB


def test_a_finished_gguf_pull_keeps_another_quants_interrupted_download(fake_hub, store: Store,
                                                                       tmp_path: Path) -> None:
    """Removing the whole repository's downloads lost an interrupted Q8_0 when Q4_K_M finished."""
    from tests.test_ftw_gguf import tiny_qwen3_moe_tensors, write_gguf

    repo = tmp_path / "gguf-repo"
    repo.mkdir()
    write_gguf(repo / "Tiny-MoE-Q4_K_M.gguf", tiny_qwen3_moe_tensors())
    (repo / "Tiny-MoE-Q8_0.gguf").write_bytes(b"another quant")
    fake_hub.add_repo("org/tiny-moe-gguf", repo)
    commit = store.root / "downloads" / "hf" / "org" / "tiny-moe-gguf" / fake_hub.commit_sha("org/tiny-moe-gguf")
    commit.mkdir(parents=True)
    (commit / "Tiny-MoE-Q8_0.gguf.part").write_bytes(b"anoth")
    pull("hf.co/org/tiny-moe-gguf:Q4_K_M", store)
    assert sorted(p.name for p in commit.iterdir()) == ["Tiny-MoE-Q8_0.gguf.part"]


def test_another_models_tokenizer_is_refused_at_pull_and_at_load(store: Store, tmp_path: Path) -> None:
    """A tokenizer with ids past the model's embedding (its files copied from another model) is
    refused with the reason and nothing registered; one registered before that check fails at
    load with the same reason, not with an IndexError mid-run."""
    from ftpull.tiny import build_tiny_checkpoint
    from runtime.text.tokenizer import Tokenizer, TokenizerError

    src = save_checkpoint("mixtral", tmp_path / "hf")  # a vocabulary of a few hundred ids
    tiny = build_tiny_checkpoint(tmp_path / "tiny")
    wrong = Tokenizer.from_files(tiny)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(tiny / name, src / name)
    vocab = __import__("json").loads((src / "config.json").read_text())["vocab_size"]
    base_ids = max(wrong.backend.get_vocab(with_added_tokens=False).values()) + 1
    assert base_ids > vocab
    with pytest.raises(PullError, match=rf"{base_ids} token ids, the model's embedding only {vocab}"):
        pull(str(src), store)
    assert store.list_models() == []
    (src / "tokenizer.json").unlink()  # registered without one, then given the wrong one in the store
    pull(str(src), store)
    (registered,) = store.list_models()
    model = open_model(store, str(registered.name))
    shutil.copyfile(tiny / "tokenizer.json", tmp_path / "tokenizer.json")
    model.files["tokenizer.json"] = tmp_path / "tokenizer.json"
    with pytest.raises(TokenizerError, match="belong to another model"):
        Tokenizer.from_model(model)


def test_a_stored_model_with_a_missing_or_short_file_is_pulled_again(store: Store) -> None:
    """`ft pull` of a present model checks its files' sizes: a truncated or missing blob makes it
    pull again where a recipe makes the name (the load error's advice), and otherwise says how
    to get the model back, not "up to date"."""
    first = pull("tiny", store)
    manifest = store.read_manifest(first.name)
    shard = next(d for d in manifest.layers if d.title.endswith(".ftw"))
    with open(store.blob_path(shard.digest), "r+b") as f:
        f.truncate(shard.size - 4096)
    again = pull("tiny", store)
    assert not again.already_present and store.verify(first.name) == []
    store.copy(first.name, "mine")
    store.blob_path(shard.digest).unlink()
    with pytest.raises(PullError, match=r"mine:latest: .*\.ftw is missing or damaged, and no recipe makes this name "
                                        r"again\. Its files came from builtin://tiny: pull or create the model made "
                                        r"from that again \(models share files: that repairs this one too\)"):
        pull("mine", store)
    assert pull("tiny", store).already_present is False  # the shared blob, made again
    assert pull("mine", store).already_present


def test_the_conversion_bar_ends_at_its_total(store: Store) -> None:
    """The total counts whole safetensors files (headers too), the converter only tensor bytes: the
    bar used to stop at 99%."""
    events = []
    pull("tiny", store, report=events.append)
    converting = [e for e in events if e.status == "converting to FTW"]
    assert converting and converting[-1].completed == converting[-1].total


def test_a_damaged_model_is_only_made_again_by_the_recipe_that_made_it(store: Store, tmp_path: Path) -> None:
    """A model created under a shipped recipe's name (olmoe, from the built-in model) is never
    replaced by that recipe's download; a variant's advice names its base; a heal that finds the
    model whole under the lock (another pull made it meanwhile) does nothing."""
    from ftpull.pull import create, install
    from ftpull.resolve import resolve

    (tmp_path / "Mine").write_text('FROM builtin://tiny\nFAMILY qwen3_moe\nSYSTEM "Mine."\n')
    created = create("olmoe", tmp_path / "Mine", store)
    (tmp_path / "Variant").write_text("FROM olmoe\nPARAMETER temperature 0\n")
    create("v", tmp_path / "Variant", store)
    shard = next(d for d in store.read_manifest(created.name).layers if d.title.endswith(".ftw"))
    with open(store.blob_path(shard.digest), "r+b") as f:
        f.truncate(1000)
    with pytest.raises(PullError, match=r"olmoe:latest: .* missing or damaged, and no recipe makes this name again"):
        pull("olmoe", store)
    with pytest.raises(PullError, match=r"v:latest: .* it is a variant of olmoe:latest and shares its files: "
                                        r"`ft pull olmoe:latest`"):
        pull("v", store)
    with pytest.raises(PullError, match=r"FROM olmoe:latest, whose .* missing or damaged; `ft pull olmoe:latest` first"):
        create("w", tmp_path / "Variant", store)
    tiny = pull("tiny", store)
    assert install(resolve("tiny"), store, heal=True).already_present  # whole: nothing made again
    assert store.read_manifest(tiny.name) == store.read_manifest("tiny")


def test_a_damaged_model_pulled_from_a_path_is_made_again_from_it(store: Store, tmp_path: Path) -> None:
    src = save_checkpoint("mixtral", tmp_path / "ckpt")
    first = pull(str(src), store)
    shard = next(d for d in store.read_manifest(first.name).layers if d.title.endswith(".ftw"))
    store.blob_path(shard.digest).unlink()
    again = pull(str(src), store)
    assert again.name == first.name and not again.already_present and store.verify(first.name) == []
    assert pull(str(src), store).already_present


def test_a_host_that_does_not_resolve_is_not_retried(store: Store, monkeypatch) -> None:
    """Offline, every shipped model cost 18-20 s of retried DNS lookups and then said "run the
    pull again: it resumes" (after `ft fit` too, where nothing resumes). A name that does not
    resolve fails at once, says the machine is offline, and that pulled models still run."""
    monkeypatch.setenv("HF_ENDPOINT", "http://ft-test-no-such-host.invalid")  # .invalid never resolves (RFC 6761)
    monkeypatch.setenv("FT_PULL_RETRIES", "5")
    monkeypatch.setenv("FT_PULL_RETRY_DELAY_S", "2")
    start = time.perf_counter()
    with pytest.raises(HubError, match=r"cannot resolve ft-test-no-such-host\.invalid: this machine is offline") as e:
        hub.fetch_checkpoint_info("Qwen/Qwen3-30B-A3B", None)
    assert time.perf_counter() - start < 2.0  # one attempt, no backoff
    assert "resumes" not in str(e.value) and "ft list" in str(e.value)
    assert "`ft pull ./model.gguf`" in str(e.value) and "HF_ENDPOINT" in str(e.value)  # the ways to work offline


def test_a_host_that_refuses_the_connection_is_not_retried(store: Store, monkeypatch) -> None:
    """HF_ENDPOINT at a port where nothing listens (a local mirror not started) was retried five
    times with backoff, 15 s, then "check the network": it fails at once, naming the host."""
    import socket

    with socket.socket() as s:  # a port that was free a moment ago: nothing listens there now
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("FT_PULL_RETRIES", "5")
    monkeypatch.setenv("FT_PULL_RETRY_DELAY_S", "2")
    start = time.perf_counter()
    with pytest.raises(hub.HubUnreachable, match=rf"looking up Qwen/Qwen3-30B-A3B: 127\.0\.0\.1 refused the connection: "
                                                 rf"nothing answers there \(http://127\.0\.0\.1:{port}, from HF_ENDPOINT\)"
                       ) as e:
        pull("hf://Qwen/Qwen3-30B-A3B", store)
    assert time.perf_counter() - start < 2.0  # one attempt, no backoff
    assert "resumes" not in str(e.value) and "`ft pull ./checkpoint-dir`" in str(e.value)


def test_a_recipe_of_a_family_not_converted_yet_is_refused_before_the_network(store: Store, monkeypatch,
                                                                               tmp_path: Path) -> None:
    """`ft pull deepseek-v4-flash` spent 19 s on the Hub before it could say ft could not convert it
    (when it could not): a shipped recipe of a family the converter does not know is refused at once.
    Every shipped recipe converts now, so the one refused here is made for the test."""
    from ftpull.modelfile import builtin_modelfiles

    recipe = tmp_path / "future-moe.Modelfile"
    recipe.write_text('DESCRIPTION "a family ft does not know"\nFROM hf://example/Future-MoE\nFAMILY future_moe\n')
    shipped = builtin_modelfiles()
    monkeypatch.setattr("ftpull.resolve.builtin_modelfiles", lambda: {**shipped, "future-moe": recipe})
    monkeypatch.setenv("HF_ENDPOINT", "http://ft-test-no-such-host.invalid")
    with pytest.raises(ResolveError, match=r"future-moe: its family 'future_moe' cannot be converted yet.*ft converts "
                                           r".*deepseek_v4.*qwen3_moe"):
        pull("future-moe", store)
