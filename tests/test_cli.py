"""The `ft` command line on the built-in and local models: output, exit codes, error messages."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from registry import Store, digest_bytes
from tests.checkpoints import save_checkpoint
from tests.clirun import ft


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("FT_HOME", str(tmp_path / "ft_home"))
    return tmp_path / "ft_home"




def test_tiny_lifecycle(home: Path, capsys) -> None:
    code, out, err = ft(capsys, "pull", "tiny")
    assert code == 0 and out.startswith("pulled tiny:latest"), err
    code, out, _ = ft(capsys, "pull", "tiny")
    assert code == 0 and out == ""  # up to date: nothing on stdout

    code, out, _ = ft(capsys, "list")
    header, row = out.splitlines()
    assert header.split() == ["NAME", "ID", "SIZE", "FAMILY", "DTYPE", "MODIFIED"]
    assert row.split()[0] == "tiny:latest" and "qwen3_moe" in row and "f32" in row

    code, out, _ = ft(capsys, "show", "tiny")
    assert "qwen3_moe" in out and "16 routed, 4 active" in out and "context length" in out

    code, out, _ = ft(capsys, "show", "tiny", "--json")
    info = json.loads(out)
    assert info["num_experts"] == 16 and info["parameters_total"] > info["parameters_active"] > 0
    assert "<|im_start|>" in info["template"]

    code, out, _ = ft(capsys, "show", "tiny", "--modelfile")
    assert "FROM builtin://tiny" in out and "FAMILY qwen3_moe" in out

    assert ft(capsys, "cp", "tiny", "myteam/tiny2:v1")[0] == 0
    code, out, _ = ft(capsys, "list", "--json")
    assert sorted(m["name"] for m in json.loads(out)["models"]) == ["myteam/tiny2:v1", "tiny:latest"]

    code, out, _ = ft(capsys, "verify", "tiny", "myteam/tiny2:v1")
    assert code == 0 and out.splitlines() == ["tiny: ok", "myteam/tiny2:v1: ok"]

    code, out, _ = ft(capsys, "rm", "tiny")
    assert code == 0
    code, out, _ = ft(capsys, "verify", "myteam/tiny2:v1")  # shared blobs survived the rm
    assert code == 0
    code, out, _ = ft(capsys, "rm", "myteam/tiny2:v1")
    assert code == 0 and "blobs freed" in out
    assert list((home / "blobs").iterdir()) == []


def test_space_held_by_a_pull_in_progress_is_named_and_freed_by_the_next_pull(home: Path, capsys) -> None:
    """ft rm while another pull runs cannot free the blobs (gc waits for pulls): it says so. A
    pull killed while it registered leaves blobs no model names: the next pull frees them before
    its fit check would count them as used."""
    ft(capsys, "pull", "tiny")
    ft(capsys, "cp", "tiny", "twin")
    store = Store(home)
    with store.pull_session():  # as another process's pull holds it, its new blob not yet named
        arriving = store.blob_path(digest_bytes(b"the other pull's shard"))
        arriving.write_bytes(b"the other pull's shard")
        code, out, _ = ft(capsys, "rm", "twin")  # every blob still tiny's: nothing to free
        assert code == 0 and "freed" not in out
        code, out, _ = ft(capsys, "rm", "tiny")
    assert code == 0 and "freed when the pull in progress ends" in out
    arriving.unlink()
    orphan = store.blob_path(digest_bytes(b"a shard moved in before the pull was killed"))
    orphan.write_bytes(b"a shard moved in before the pull was killed")
    not_a_model = home.parent / "not-a-model"
    not_a_model.mkdir()
    (not_a_model / "config.json").write_text('{"model_type": "llama"}')
    assert ft(capsys, "pull", str(not_a_model))[0] != 0  # a pull that fails frees them too
    assert not orphan.exists() and store.unreferenced_bytes() == 0


def test_rm_removes_a_model_whose_manifest_is_damaged(home: Path, capsys) -> None:
    """The corrupt-manifest error advises `ft rm`; reading the manifest first made rm fail too."""
    ft(capsys, "pull", "tiny")
    ft(capsys, "cp", "tiny", "broken")
    store = Store(home)
    store.manifest_path("broken").write_text("{not json")
    code, out, err = ft(capsys, "rm", "broken")
    assert code == 0 and "deleted 'broken'" in out, err
    assert not store.manifest_path("broken").exists() and store.verify("tiny") == []


def test_verify_names_the_bad_file(home: Path, capsys) -> None:
    ft(capsys, "pull", "tiny")
    store = Store(home)
    manifest = store.read_manifest("tiny")
    shard = next(d for d in manifest.layers if d.title == "model-00001.ftw")
    path = store.blob_path(shard.digest)
    path.chmod(0o644)
    with open(path, "r+b") as f:
        f.seek(1000)
        f.write(b"\xff")
    code, out, err = ft(capsys, "verify", "tiny")
    assert code == 1 and "model-00001.ftw: corrupt" in err and "`ft rm tiny` and `ft pull tiny`" in err


def test_verify_advises_the_fix_that_works_for_each_kind_of_model(home: Path, tmp_path: Path, capsys) -> None:
    """`ft pull NAME` fetches neither a local checkpoint's model nor a created one: each gets the
    way it can be made again."""
    checkpoint = save_checkpoint("mixtral", tmp_path / "ckpt")
    ft(capsys, "pull", str(checkpoint))
    (tmp_path / "Modelfile").write_text(f"FROM {checkpoint}\nFAMILY mixtral\n")
    ft(capsys, "create", "mine", "-f", str(tmp_path / "Modelfile"))
    store = Store(home)
    for name in ("local/ckpt", "mine"):
        shard = next(d for d in store.read_manifest(name).layers if d.title == "model-00001.ftw")
        path = store.blob_path(shard.digest)
        path.chmod(0o644)
        path.write_bytes(path.read_bytes()[:-1])
    assert f"`ft pull {checkpoint}` (its checkpoint)" in ft(capsys, "verify", "local/ckpt")[2]
    assert "`ft create mine -f Modelfile`" in ft(capsys, "verify", "mine")[2]
    ft(capsys, "pull", "tiny")
    ft(capsys, "cp", "tiny", "tiny:mine")  # a shipped model's name with a tag no recipe has
    shard = next(d for d in store.read_manifest("tiny").layers if d.title == "model-00001.ftw")
    store.blob_path(shard.digest).chmod(0o644)
    store.blob_path(shard.digest).write_bytes(b"")
    code, _, err = ft(capsys, "verify", "tiny:mine", "tiny")
    assert code == 1 and "tiny:mine: 1 bad file(s); run `ft rm tiny:mine` and make it again" in err
    assert "tiny: 1 bad file(s); run `ft rm tiny` and `ft pull tiny` again" in err  # the next name checked too


def test_create_from_modelfile(home: Path, tmp_path: Path, capsys) -> None:
    save_checkpoint("mixtral", tmp_path / "ckpt")
    modelfile = tmp_path / "Modelfile"
    modelfile.write_text('FROM ./ckpt\nFAMILY mixtral\nDTYPE bf16\nPARAMETER temperature 0.2\nSYSTEM "Be brief."\n')
    code, out, err = ft(capsys, "create", "mymix", "-f", str(modelfile))
    assert code == 0 and out.startswith("created mymix:latest"), err
    code, out, _ = ft(capsys, "show", "mymix", "--json")
    info = json.loads(out)
    assert info["dtype"] == "bf16" and info["parameters"] == {"temperature": 0.2}
    assert "SYSTEM" in info["modelfile"]


def test_create_a_variant_of_a_stored_model(home: Path, tmp_path: Path, capsys) -> None:
    """Ollama's `FROM MODEL`: a variant shares the stored model's weights (no blob added but its
    recipe's), keeps the base's recipe where it states nothing (PARAMETERs key by key, TEMPLATE),
    and runs; FAMILY may be left out. A base with a TEMPLATE passes it on."""
    (tmp_path / "Base").write_text('FROM builtin://tiny\nFAMILY qwen3_moe\nPARAMETER temperature 0.2\n'
                                   'PARAMETER top_k 5\nTEMPLATE "{{ messages[-1].content }}"\nDESCRIPTION "the base"\n')
    assert ft(capsys, "create", "base", "-f", str(tmp_path / "Base"))[0] == 0
    store = Store(home)
    base_blobs = {d.digest for d in store.read_manifest("base").layers}
    (tmp_path / "Modelfile").write_text('FROM base\nSYSTEM "You are terse."\nPARAMETER temperature 0.7\n')
    code, out, err = ft(capsys, "create", "terse", "-f", str(tmp_path / "Modelfile"))
    assert code == 0 and out.startswith("created terse:latest"), err
    layers = store.read_manifest("terse").layers
    shards = [d for d in layers if d.title.endswith(".ftw") or d.title == "model.ftw.json"]
    assert shards and all(d.digest in base_blobs for d in shards)  # the same blobs, not copies
    info = json.loads(ft(capsys, "show", "terse", "--json")[1])
    assert info["parameters"] == {"temperature": 0.7, "top_k": 5} and info["description"] == "the base"
    assert 'SYSTEM "You are terse."' in info["modelfile"] and "FROM builtin://tiny" in info["modelfile"]
    assert ft(capsys, "show", "terse", "--template")[1].strip() == "{{ messages[-1].content }}"
    code, out, err = ft(capsys, "run", "terse", "Hello", "--num-predict", "3", "--local")
    assert code == 0 and out.strip(), err
    assert ft(capsys, "rm", "base")[0] == 0  # the variant keeps the weights it shares
    assert ft(capsys, "verify", "terse")[0] == 0


@pytest.mark.parametrize(("lines", "words"), [
    ("FROM nothing-stored\n", "FROM nothing-stored is neither a directory"),
    ("FROM tiny\nFAMILY mixtral\n", "FAMILY mixtral, but tiny:latest is qwen3_moe"),
    ("FROM tiny\nDTYPE bf16\n", "DTYPE bf16, but a variant of tiny:latest keeps its f32 weights"),
])
def test_a_variant_that_cannot_be_made_says_why(home: Path, tmp_path: Path, capsys, lines: str, words: str) -> None:
    assert ft(capsys, "pull", "tiny")[0] == 0
    (tmp_path / "Modelfile").write_text(lines)
    code, _, err = ft(capsys, "create", "v", "-f", str(tmp_path / "Modelfile"))
    assert code == 1 and words in err, err
    assert [str(m.name.display) for m in Store(home).list_models()] == ["tiny:latest"]


@pytest.mark.parametrize(("lines", "license"), [
    ('LICENSE """MIT License\nCopyright (c) 2024 Someone"""', "MIT License\nCopyright (c) 2024 Someone"),
    ('LICENSE "Llama 3 \\"Community\\" License"', 'Llama 3 "Community" License'),
    ('SYSTEM """Be brief.\nLicense questions: ask legal."""\nLICENSE apache-2.0', "apache-2.0"),
])
def test_show_license_is_the_modelfiles(home: Path, tmp_path: Path, capsys, lines: str, license: str) -> None:
    """A block, an escaped quote, a SYSTEM line that starts with "License": ft show --license gives
    the LICENSE as the Modelfile says it (it re-read the stored Modelfile line by line)."""
    modelfile = tmp_path / "Modelfile"
    modelfile.write_text(f"FROM builtin://tiny\nFAMILY qwen3_moe\n{lines}\n")
    assert ft(capsys, "create", "licensed", "-f", str(modelfile))[0] == 0
    code, out, _ = ft(capsys, "show", "licensed", "--license")
    assert code == 0 and out.strip() == license


def test_create_reads_the_modelfile_here_without_f(home: Path, tmp_path: Path, capsys, monkeypatch) -> None:
    """As `ollama create NAME`: ./Modelfile, an Ollama one (unquoted SYSTEM, PARAMETER num_gpu)."""
    (tmp_path / "Modelfile").write_text("FROM builtin://tiny\nFAMILY qwen3_moe\nSYSTEM You are a pirate.\n"
                                        "PARAMETER num_gpu 99\n")
    monkeypatch.chdir(tmp_path)
    assert ft(capsys, "create", "pirate")[0] == 0
    assert ft(capsys, "show", "pirate", "--system")[1].strip() == "You are a pirate."
    monkeypatch.chdir(home)
    code, _, err = ft(capsys, "create", "nothing")
    assert code == 2 and "'Modelfile' does not exist" in err


def test_show_has_a_system_section_and_prints_the_system_message(home: Path, tmp_path: Path, capsys) -> None:
    modelfile = tmp_path / "Modelfile"
    modelfile.write_text('FROM builtin://tiny\nFAMILY qwen3_moe\nSYSTEM """You are terse.\nAnswer in one line."""\n')
    assert ft(capsys, "create", "terse", "-f", str(modelfile))[0] == 0
    code, out, _ = ft(capsys, "show", "terse")
    assert code == 0 and "  System\n    You are terse.\n    Answer in one line.\n" in out
    code, out, _ = ft(capsys, "show", "terse", "--system")
    assert code == 0 and out.strip() == "You are terse.\nAnswer in one line."
    assert ft(capsys, "pull", "tiny")[0] == 0
    code, out, _ = ft(capsys, "show", "tiny", "--system")
    assert code == 0 and out.strip() == "(no system message)" and "  System" not in ft(capsys, "show", "tiny")[1]


def test_show_parameters_prints_a_line_a_value(home: Path, tmp_path: Path, capsys) -> None:
    """As Ollama: a list parameter (stop) is a line a value, strings quoted (it printed a Python list)."""
    modelfile = tmp_path / "Modelfile"
    modelfile.write_text('FROM builtin://tiny\nFAMILY qwen3_moe\nPARAMETER stop "<|im_end|>"\nPARAMETER stop "</s>"\n')
    assert ft(capsys, "create", "stops", "-f", str(modelfile))[0] == 0
    code, out, _ = ft(capsys, "show", "stops", "--parameters")
    assert code == 0 and [line.split() for line in out.splitlines()] == [["stop", '"<|im_end|>"'], ["stop", '"</s>"']]


def test_create_malformed_modelfile(home: Path, tmp_path: Path, capsys) -> None:
    modelfile = tmp_path / "Modelfile"
    modelfile.write_text("FROM ./ckpt\nFAMILY mixtral\nPARAMETER temperature hot\n")
    code, _, err = ft(capsys, "create", "bad", "-f", str(modelfile))
    assert code == 1 and f"{modelfile}:3:" in err and "temperature" in err
    assert Store(home).list_models() == []


def test_create_family_mismatch(home: Path, tmp_path: Path, capsys) -> None:
    save_checkpoint("mixtral", tmp_path / "ckpt")
    modelfile = tmp_path / "Modelfile"
    modelfile.write_text("FROM ./ckpt\nFAMILY qwen3_moe\n")
    code, _, err = ft(capsys, "create", "bad", "-f", str(modelfile))
    assert code == 1 and "family 'qwen3_moe'" in err and "'mixtral'" in err
    modelfile.write_text("FROM builtin://tiny\nFAMILY mixtral\n")  # the built-in model is checked as well
    code, _, err = ft(capsys, "create", "bad", "-f", str(modelfile))
    assert code == 1 and "family 'mixtral'" in err and "'qwen3_moe'" in err
    modelfile.write_text("FROM builtin://tiny\nFAMILY qwen3_moe\n")
    assert ft(capsys, "create", "good", "-f", str(modelfile))[0] == 0


@pytest.mark.parametrize("args", [
    ("pull", "../../etc/passwd:latest"),
    ("rm", "../escape"),
    ("cp", "tiny", "../../outside"),
    ("show", "a/b/c/d/e"),
    ("pull", "model:tag/../../x"),
])
def test_names_cannot_escape_the_store(home: Path, tmp_path: Path, capsys, args) -> None:
    ft(capsys, "pull", "tiny")
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    code, _, err = ft(capsys, *args)
    assert code == 1 and err.startswith("Error:")
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before


def test_unknown_model_suggests(home: Path, capsys) -> None:
    code, _, err = ft(capsys, "pull", "qwen3-30b")
    assert code == 1 and "did you mean" in err and "qwen3-30b-a3b" in err
    code, _, err = ft(capsys, "show", "nothing")
    assert code == 1 and "ft list" in err


def test_pull_and_run_accept_any_stored_name(home: Path, capsys) -> None:
    ft(capsys, "pull", "tiny")
    assert ft(capsys, "cp", "tiny", "myteam/copy:v2")[0] == 0
    code, out, err = ft(capsys, "pull", "myteam/copy:v2")  # no recipe makes this name: it is simply present
    assert code == 0 and "up to date" in err
    code, out, _ = ft(capsys, "run", "myteam/copy:v2", "hi", "--num-predict", "4", "--local")
    assert code == 0 and out.strip()


def test_rm_removes_whatever_the_server_address_says(home: Path, capsys, monkeypatch) -> None:
    """`ft rm` asks a running server to unload first, best effort: an FT_HOST that is no address,
    or something that is no ft server on it, never keeps the model from being removed."""
    import socket
    import threading

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)

    def banner() -> None:  # an SSH-like service: not HTTP at all
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                conn.sendall(b"SSH-2.0-OpenSSH_9.6\r\n")

    threading.Thread(target=banner, daemon=True).start()
    try:
        for host in ("foo:bar", f"127.0.0.1:{listener.getsockname()[1]}"):
            assert ft(capsys, "pull", "tiny")[0] == 0
            monkeypatch.setenv("FT_HOST", host)
            code, out, _ = ft(capsys, "rm", "tiny")
            monkeypatch.delenv("FT_HOST")
            assert code == 0 and "deleted 'tiny'" in out, host
            assert Store(home).list_models() == []
    finally:
        listener.close()


def test_a_misspelled_local_name_is_told_the_name_it_likely_meant(home: Path, capsys) -> None:
    """show, rm, cp and verify of a near miss name the stored model, not `ft pull` of the misspelling."""
    assert ft(capsys, "pull", "tiny")[0] == 0
    for args in (("show", "tinny"), ("rm", "tiny:latset"), ("cp", "tinyy", "copy"), ("verify", "tiy")):
        code, _, err = ft(capsys, *args)
        assert code == 1 and "did you mean 'tiny:latest'?" in err and "ft pull" not in err, (args, err)
    code, _, err = ft(capsys, "show", "qwen-nothing-like-it")
    assert code == 1 and "`ft pull qwen-nothing-like-it:latest` to download it" in err


def test_names_are_case_insensitive_tags_too(home: Path, capsys) -> None:
    """As Ollama: `ft cp tiny UPPER:TagX` then `ft show upper:tagx` is one model (the tag was kept
    as typed and then not found); a tag stored with capitals before is still found."""
    assert ft(capsys, "pull", "tiny")[0] == 0
    assert ft(capsys, "cp", "tiny", "UPPER:TagX")[0] == 0
    for spelled in ("upper:tagx", "UPPER:TAGX", "Upper:TagX"):
        assert ft(capsys, "show", spelled, "--system")[0] == 0, spelled
    assert "upper:tagx" in ft(capsys, "list")[1]
    store = Store(home)
    legacy = store.manifest_path("tiny").read_bytes()
    old = store.manifests_dir / "ft.local" / "library" / "old" / "Q4_K_M"  # as an earlier ft stored it
    old.parent.mkdir(parents=True)
    old.write_bytes(legacy)
    assert ft(capsys, "show", "old:q4_k_m", "--system")[0] == 0 and ft(capsys, "rm", "old:Q4_K_M")[0] == 0
    assert not old.exists()


def test_a_blob_rotted_on_the_disk_is_refused_at_load_and_healed_by_pull(home: Path, capsys, monkeypatch) -> None:
    """Same size, other bytes (it was loaded without a word, and `ft pull` said "up to date"): a
    load's sampled check refuses it with the fix, and `ft pull` (or the pull `ft run` makes first)
    fetches it again. (Every blob sampled here, as a large one is: the tiny model's are hashed whole.)"""
    from ftw.errors import CorruptShardError
    from registry import verify

    monkeypatch.setattr(verify, "QUICK_FULL_HASH_MAX_BYTES", 0)
    from runtime.loading.registered import MEDIA_FTW_SHARD, open_model
    from runtime.loading.runnable import load_registered

    assert ft(capsys, "pull", "tiny")[0] == 0
    store = Store(home)
    shard = next(d for d in store.read_manifest("tiny").layers if d.media_type == MEDIA_FTW_SHARD)
    path = store.blob_path(shard.digest)
    good = path.read_bytes()

    def rot() -> None:
        data = bytearray(good)
        data[100] ^= 0xFF  # (the first bytes are always among the samples)
        path.write_bytes(bytes(data))

    rot()
    with pytest.raises(CorruptShardError, match=r"model-00001.ftw .*a sampled check.*`ft pull tiny:latest`"):
        load_registered(open_model(store, "tiny"))
    code, out, err = ft(capsys, "pull", "tiny")
    assert code == 0 and "missing or damaged; pulling it again" in out + err, out + err
    assert path.read_bytes() == good
    rot()
    code, out, err = ft(capsys, "run", "tiny", "hi", "--num-predict", "1", "--local")
    assert code == 0 and "missing or damaged; pulling it again" in out + err and path.read_bytes() == good


def test_a_small_blob_is_hashed_whole_at_load(home: Path, capsys) -> None:
    """A byte flipped between two of the 64 samples of the tiny model's 8 MB shard was loaded
    without a word: a blob of at most 64 MiB is hashed whole when a model loads."""
    from ftw.errors import CorruptShardError
    from registry.blobs import SAMPLE_BYTES, SAMPLE_CHUNKS
    from runtime.loading.registered import MEDIA_FTW_SHARD, open_model
    from runtime.loading.runnable import load_registered

    assert ft(capsys, "pull", "tiny")[0] == 0
    store = Store(home)
    shard = next(d for d in store.read_manifest("tiny").layers if d.media_type == MEDIA_FTW_SHARD)
    path = store.blob_path(shard.digest)
    assert shard.size > SAMPLE_CHUNKS * SAMPLE_BYTES  # (sampled, not read whole, by the sampled digest)
    data = bytearray(path.read_bytes())
    data[SAMPLE_BYTES + 100] ^= 0xFF  # after the first sample, before the second (at ~size / 63)
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptShardError, match=r"model-00001.ftw .*corrupt: sha256 is .*`ft pull tiny:latest`"):
        load_registered(open_model(store, "tiny"))
    code, out, err = ft(capsys, "run", "tiny", "hi", "--num-predict", "1", "--local")  # its pull sees it too
    assert code == 0 and "missing or damaged; pulling it again" in out + err
    assert store.verify("tiny") == []  # whole again
