"""Mutated model files never crash ft or slip past it (issue 26): a tiny model's safetensors header
and config, a tiny GGUF file, and a stored FTW index, each mutated from a fixed seed. Every case
ends in a pull that succeeds, and then `ft run` loads the model and produces logits (a token), or
in a typed error: exit status 1, one `Error:` line naming the file or tensor and the fix, no
traceback, and after a refused pull nothing in the store that was not there before.

The default run is bounded (DEFAULT_CASES, well under a minute); `-m fuzz_full` sweeps FULL_CASES,
the sizes of the fuzz run that found the bugs."""

from __future__ import annotations

import copy
import json
import os
import random
import re
import shutil
import struct
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ftpull.tiny import build_tiny_checkpoint
from registry import Store
from runtime.loading.registered import MEDIA_FTW_INDEX
from tests.clirun import ft
from tests.test_ftw_gguf import Q, tiny_qwen3_moe_tensors, write_gguf
from tests.test_server_util import free_port, pulled_home

# the number: a failure names its case, and the case comes back the same (FT_FUZZ_SEED
# explores other cases: `FT_FUZZ_SEED=7 pytest -m fuzz_full tests/test_fuzz_model_files.py`)
SEED = int(os.environ.get("FT_FUZZ_SEED", "26"))
DEFAULT_CASES = {"safetensors": 64, "gguf": 48, "index": 64}
FULL_CASES = {"safetensors": 224, "gguf": 208, "index": 116}
ODD_INTS = (0, -1, 1, 2, 3, 99, 10**30, 2**31, None, "x", 1.5, [], True)

Doc = dict[str, Any]


@pytest.fixture(scope="module")
def tiny_source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_checkpoint(tmp_path_factory.mktemp("tiny_source"))


@pytest.fixture(scope="module")
def pulled(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("pulled")
    pulled_home(root)
    return root


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "ft_home"
    monkeypatch.setenv("FT_HOME", str(root))
    monkeypatch.setenv("FT_HOST", f"127.0.0.1:{free_port()}")  # no server answers there
    return root


# each sweep runs bounded by default; its full size is marked, and skipped unless selected
SWEEPS = [pytest.param("default"), pytest.param("full", marks=pytest.mark.fuzz_full)]


def _cases(kind: str, sweep: str, request: pytest.FixtureRequest) -> int:
    if sweep == "default":
        return DEFAULT_CASES[kind]
    if "fuzz_full" not in (request.config.getoption("markexpr") or ""):
        pytest.skip("the full sweep runs with -m fuzz_full")
    return FULL_CASES[kind]


def _files(home: Path) -> list[str]:
    """What a pull leaves behind (its locks aside: empty lock files are how it waits)."""
    if not home.exists():
        return []
    return sorted(str(p.relative_to(home)) for p in home.rglob("*") if p.is_file() and "locks" not in p.parts)


def _assert_typed_refusal(what: str, code: int, err: str) -> str:
    """Exit status 1 and one `Error:` message (after a pull's progress lines); returns the message."""
    assert code == 1, (what, code, err)
    assert "Traceback" not in err, (what, err)
    starts = [i for i, line in enumerate(err.splitlines()) if line.startswith("Error: ")]
    assert len(starts) == 1, (what, err)
    return "\n".join(err.splitlines()[starts[0]:])


def _pull_then_run(capsys: pytest.CaptureFixture[str], home: Path, what: str, source: Path, name: str) -> str:
    """`ft pull source`: refused by a typed error with the store as it was, or pulled and then run."""
    before = _files(home)
    try:
        code, _, err = ft(capsys, "pull", str(source))
    except Exception as e:  # noqa: BLE001 - the point: any other exception is the bug
        pytest.fail(f"{what}: `ft pull` crashed with {type(e).__name__}: {e}")
    if code != 0:
        message = _assert_typed_refusal(what, code, err)
        named = (source.name, "config.json", "tensor '")  # the file, or (the fit check's, before a download) the tensor
        assert any(n in message for n in named), (what, "the message names neither file nor tensor", message)
        assert _files(home) == before, (what, "a refused pull left files behind")
        return "refused"
    _assert_runs(capsys, what, name)
    assert ft(capsys, "rm", name)[0] == 0
    return "runs"


def _assert_runs(capsys: pytest.CaptureFixture[str], what: str, name: str) -> None:
    """`ft run` loads `name` and generates a token (a forward pass, logits sampled)."""
    try:
        code, out, err = ft(capsys, "run", "--num-predict", "1", "--seed", "0", name, "hi")
    except Exception as e:  # noqa: BLE001
        pytest.fail(f"{what}: pulled, then `ft run` crashed with {type(e).__name__}: {e}")
    if code != 0:  # a model may say its context is shorter than the prompt; nothing else may refuse it now
        message = _assert_typed_refusal(what, code, err)
        assert "shorten it or raise num_ctx" in message, (what, "pulled, then `ft run` refused it", err)


# -- safetensors --------------------------------------------------------------------------------


def _read_safetensors(path: Path) -> tuple[Doc, bytes]:
    raw = path.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    return json.loads(raw[8 : 8 + n]), raw[8 + n :]


def _write_safetensors(path: Path, header: Doc, data: bytes) -> None:
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + data)


def _mutate_header(header: Doc, config: Doc, rng: random.Random) -> str:
    """One mutation of a tensor entry (data_offsets kept where its bytes still match)."""
    names = [n for n in header if n != "__metadata__"]
    dense = [n for n in names if ".experts." not in n]
    name = rng.choice(dense if rng.random() < 0.7 else names)
    entry = header[name]
    shape = entry["shape"]
    op = rng.choice(["drop", "rename", "swap", "unsqueeze", "flatten", "zero", "f16", "copy_beyond"])
    if op == "drop":
        del header[name]
    elif op == "rename":
        new = name.replace("layers.0.", "layers.9.") if "layers.0." in name else name.replace(".weight", ".weigth")
        header[new] = header.pop(name)
    elif op == "swap":
        entry["shape"] = shape[::-1]
    elif op == "unsqueeze":
        entry["shape"] = [*shape, 1] if rng.random() < 0.5 else [1, *shape]
    elif op == "flatten":
        entry["shape"] = [int(np.prod(shape))]
    elif op == "zero":
        entry["shape"] = [0, *shape[1:]]
        entry["data_offsets"] = [entry["data_offsets"][0]] * 2
    elif op == "f16":  # the same bytes, read as twice as many halves
        entry.update(dtype="F16", shape=[*shape[:-1], shape[-1] * 2])
    else:  # a copy of the tensor in a layer or expert the config does not have
        layers = config["num_hidden_layers"]
        beyond = name.replace("experts.0.", f"experts.{config['num_experts']}.") if "experts.0." in name \
            else name.replace("layers.0.", f"layers.{layers}.")
        header[beyond if beyond != name else "model.layers.99.input_layernorm.weight"] = dict(entry)
    return f"{op} {name}"


def _mutate_config(config: Doc, rng: random.Random) -> str:
    key = rng.choice(["num_hidden_layers", "hidden_size", "num_experts", "num_experts_per_tok",
                      "moe_intermediate_size", "head_dim", "num_attention_heads", "num_key_value_heads", "vocab_size",
                      "max_position_embeddings", "mlp_only_layers", "decoder_sparse_step", "rms_norm_eps", "rope_theta",
                      "tie_word_embeddings"])
    value = rng.choice([*ODD_INTS, config.get(key), [0], [99], 1e-30, float("nan")])
    if isinstance(config.get(key), int) and rng.random() < 0.4:
        value = config[key] + rng.choice([-1, 1, config[key]])
    config[key] = value
    return f"config {key}={value!r}"


def _sweep_safetensors(capsys: pytest.CaptureFixture[str], home: Path, tiny_source: Path, work: Path,
                       cases: int) -> Counter[str]:
    header, data = _read_safetensors(tiny_source / "model.safetensors")
    config = json.loads((tiny_source / "config.json").read_text())
    rng, outcomes = random.Random(SEED), Counter[str]()
    for case in range(cases):
        h, c = copy.deepcopy(header), copy.deepcopy(config)
        what = f"safetensors case {case}: " + (_mutate_config(c, rng) if rng.random() < 0.25 else _mutate_header(h, c, rng))
        source = work / f"st-{case}"
        shutil.copytree(tiny_source, source, ignore=shutil.ignore_patterns("model.safetensors", "config.json"))
        (source / "config.json").write_text(json.dumps(c))
        _write_safetensors(source / "model.safetensors", h, data)
        outcomes[_pull_then_run(capsys, home, what, source, f"local/st-{case}")] += 1
        shutil.rmtree(source)
    return outcomes


@pytest.mark.parametrize("sweep", SWEEPS)
def test_safetensors_mutations_are_run_or_refused_by_name(sweep: str, capsys: pytest.CaptureFixture[str], home: Path,
                                                          tiny_source: Path, tmp_path: Path,
                                                          request: pytest.FixtureRequest) -> None:
    outcomes = _sweep_safetensors(capsys, home, tiny_source, tmp_path, _cases("safetensors", sweep, request))
    assert outcomes["refused"] > sum(outcomes.values()) // 2 and outcomes["runs"] > 0, outcomes  # the mutations bite


def test_a_missing_attention_weight_is_refused_before_anything_is_written(capsys: pytest.CaptureFixture[str],
                                                                          home: Path, tiny_source: Path,
                                                                          tmp_path: Path) -> None:
    """The fuzz run's first find: o_proj gone from the header converted, verified, then crashed `ft run`."""
    header, data = _read_safetensors(tiny_source / "model.safetensors")
    del header["model.layers.0.self_attn.o_proj.weight"]
    source = tmp_path / "no-o-proj"
    shutil.copytree(tiny_source, source)
    _write_safetensors(source / "model.safetensors", header, data)
    code, _, err = ft(capsys, "pull", str(source))
    _assert_typed_refusal("o_proj dropped", code, err)
    assert str(source) in err and "'model.layers.0.self_attn.o_proj.weight'" in err and "download it again" in err
    assert _files(home) == []


# -- GGUF ---------------------------------------------------------------------------------------


def _patch_gguf_dims(raw: bytearray, name: str, rng: random.Random) -> str:
    """Rewrite one tensor's dimensions in the GGUF header (its data left as it is)."""
    key = struct.pack("<Q", len(name)) + name.encode()
    at = raw.index(key) + len(key)
    n_dims = struct.unpack_from("<I", raw, at)[0]
    dims = list(struct.unpack_from(f"<{n_dims}Q", raw, at + 4))
    op = rng.choice(["zero", "swap", "grow"])
    if op == "zero":
        dims[rng.randrange(n_dims)] = 0
    elif op == "swap":
        dims.reverse()
    else:
        dims[rng.randrange(n_dims)] += rng.choice([1, 32, 256])
    struct.pack_into(f"<{n_dims}Q", raw, at + 4, *dims)
    return f"dims of {name} -> {dims}"


def _gguf_case(path: Path, rng: random.Random) -> str:
    tensors = tiny_qwen3_moe_tensors()
    op = rng.choice(["drop", "rename", "unsqueeze", "transpose", "metadata", "header"])
    name = rng.choice(sorted(tensors))
    metadata: Doc = {}
    if op == "drop":
        del tensors[name]
    elif op == "rename":
        tensors[name.replace("blk.0.", "blk.7.") if "blk.0." in name else name.replace(".weight", ".wieght")] = \
            tensors.pop(name)
    elif op in ("unsqueeze", "transpose"):
        floats = [n for n, (q, _) in tensors.items() if q in (Q.F32, Q.F16)]
        name = rng.choice(floats)
        qtype, array = tensors[name]
        tensors[name] = (qtype, np.ascontiguousarray(array[..., None] if op == "unsqueeze" else array.T))
    elif op == "metadata":
        name = "qwen3moe." + rng.choice(["block_count", "embedding_length", "expert_count", "expert_used_count",
                                         "expert_feed_forward_length", "attention.head_count",
                                         "attention.head_count_kv", "attention.key_length", "context_length"])
        metadata[name] = rng.choice([0, 1, 3, 7, 64, 255, 2**31 - 1])
    write_gguf(path, tensors, metadata=metadata)
    if op == "header":
        raw = bytearray(path.read_bytes())
        what = _patch_gguf_dims(raw, name, rng)
        path.write_bytes(bytes(raw))
        return what
    return f"{op} {name}" + (f"={metadata[name]}" if metadata else "")


@pytest.mark.parametrize("sweep", SWEEPS)
def test_gguf_mutations_are_run_or_refused_by_name(sweep: str, capsys: pytest.CaptureFixture[str], home: Path, tmp_path: Path,
                                                   request: pytest.FixtureRequest) -> None:
    rng, outcomes = random.Random(SEED), Counter[str]()
    for case in range(_cases("gguf", sweep, request)):
        path = tmp_path / f"g-{case}.gguf"
        what = f"gguf case {case}: " + _gguf_case(path, rng)
        outcomes[_pull_then_run(capsys, home, what, path, f"local/g-{case}")] += 1
        path.unlink()
    assert outcomes["refused"] > sum(outcomes.values()) // 3 and outcomes["runs"] > 0, outcomes


def test_a_norm_of_no_elements_is_refused(capsys: pytest.CaptureFixture[str], home: Path, tmp_path: Path) -> None:
    """The GGUF fuzz run's find: a norm's dimension rewritten to 0 converted, then crashed `ft run`."""
    path = write_gguf(tmp_path / "tiny.gguf", tiny_qwen3_moe_tensors())
    raw = bytearray(path.read_bytes())
    key = struct.pack("<Q", len("blk.0.attn_q_norm.weight")) + b"blk.0.attn_q_norm.weight"
    struct.pack_into("<Q", raw, raw.index(key) + len(key) + 4, 0)
    path.write_bytes(bytes(raw))
    code, _, err = ft(capsys, "pull", str(path))
    _assert_typed_refusal("q_norm of 0", code, err)
    assert str(path) in err and "q_norm.weight" in err and _files(home) == []


# -- a stored FTW index -------------------------------------------------------------------------


def _mutate_index(index: Doc, rng: random.Random) -> str:
    op = rng.choice(["tensor", "tensor", "bank", "config", "config", "source"])
    if op == "tensor":
        t = rng.choice(index["tensors"])
        how = rng.choice(["drop", "rename", "swap", "unsqueeze", "shape96", "f16"])
        if how == "drop":
            index["tensors"].remove(t)
        elif how == "rename":
            t["name"] = t["name"].replace("layers.1.", "layers.99.") if "layers.1." in t["name"] else t["name"] + "x"
        elif how == "swap":
            t["shape"] = t["shape"][::-1]
        elif how == "unsqueeze":
            t["shape"] = [*t["shape"], 1]
        elif how == "shape96":  # its bytes follow the shape: a smaller tensor, consistent in the layout
            t["shape"], t["nbytes"] = [96, 1], 96 * 4
        else:
            t["dtype"], t["shape"] = "f16", [*t["shape"][:-1], t["shape"][-1] * 2]
        return f"tensor {t['name']}: {how}"
    if op == "bank":
        b = rng.choice(index["banks"])
        how = rng.choice(["layer99", "layer_dup", "experts", "part_rename", "part_swap", "part_drop", "part_dim"])
        part = rng.choice(b["parts"])
        if how == "layer99":
            b["layer"] = 99
        elif how == "layer_dup":
            b["layer"] = (b["layer"] + 1) % len(index["banks"])
        elif how == "experts":
            b["num_experts"] = rng.choice([1, b["num_experts"] - 1])
        elif how == "part_rename":
            part["name"] = rng.choice(["w1", "w3", "w13x", "w2_scale"])
        elif how == "part_swap":
            part["shape"] = part["shape"][::-1]
        elif how == "part_drop":
            b["parts"].remove(part)
        else:
            part["shape"] = [*part["shape"], 1]
        return f"bank of layer {b['layer']}: {how} {part['name']}"
    if op == "config":
        key = rng.choice(["context_length", "moe_layers", "num_layers", "hidden_size", "num_experts",
                          "num_experts_per_tok", "head_dim", "num_key_value_heads", "num_attention_heads",
                          "moe_intermediate_size", "vocab_size", "family", "tie_word_embeddings"])
        value = rng.choice([*ODD_INTS, [99], [0, 0], [3, 1], "mixtral", "nope", 64, 8, 17])
        index["config"][key] = value
        return f"config {key}={value!r}"
    key = rng.choice(["rms_norm_eps", "rope_theta", "max_position_embeddings", "num_hidden_layers", "model_type"])
    value = rng.choice([*ODD_INTS, -1e-6, float("inf"), "mixtral"])
    index["source_config"][key] = value
    return f"source_config {key}={value!r}"


def _tensor(index: Doc, name: str) -> Doc:
    return next(t for t in index["tensors"] if t["name"] == name)


def _store_mutated_index(store: Store, name: str, index: Doc) -> None:
    manifest = json.loads(store.manifest_path("tiny").read_bytes())
    ref = store.add_blob_bytes(json.dumps(index).encode())
    layer = next(d for d in manifest["layers"] if d["mediaType"] == MEDIA_FTW_INDEX)
    layer.update(digest=ref.digest, size=ref.size)
    path = store.manifest_path(name)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(manifest))


@pytest.mark.parametrize("sweep", SWEEPS)
def test_stored_index_mutations_are_run_or_refused_by_name(sweep: str, capsys: pytest.CaptureFixture[str], pulled: Path,
                                                           tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                           request: pytest.FixtureRequest) -> None:
    home = tmp_path / "ft_home"
    shutil.copytree(pulled, home)
    monkeypatch.setenv("FT_HOME", str(home))
    monkeypatch.setenv("FT_HOST", f"127.0.0.1:{free_port()}")
    store = Store(home)
    layer = next(d for d in store.read_manifest("tiny").layers if d.media_type == MEDIA_FTW_INDEX)
    original = json.loads(store.blob_path(layer.digest).read_bytes())
    rng, outcomes = random.Random(SEED), Counter[str]()
    for case in range(_cases("index", sweep, request)):
        index = copy.deepcopy(original)
        what = f"index case {case}: " + _mutate_index(index, rng)
        _store_mutated_index(store, f"fuzz-{case}", index)
        try:
            code, _, err = ft(capsys, "run", "--num-predict", "1", "--seed", "0", f"fuzz-{case}", "hi")
        except Exception as e:  # noqa: BLE001 - the point: any other exception is the bug
            pytest.fail(f"{what}: `ft run` crashed with {type(e).__name__}: {e}")
        if code == 0:
            outcomes["runs"] += 1
            continue
        _assert_typed_refusal(what, code, err)
        assert f"fuzz-{case}" in err and "`ft " in err, (what, err)  # names the model and the fix
        outcomes["refused"] += 1
    assert outcomes["refused"] > sum(outcomes.values()) // 2 and outcomes["runs"] > 0, outcomes


@pytest.mark.parametrize(("edit", "message"), [
    (lambda i: i["config"].update(context_length=0), "context_length is 0, but the checkpoint's config gives 2048"),
    (lambda i: i["config"].update(context_length=10**30), f"context_length is {10**30}, not a whole number"),
    (lambda i: i["config"].update(moe_layers=[99]), r"moe_layers is \[99\], not distinct layer numbers"),
    (lambda i: i["banks"][0].update(layer=99), r"expert banks are for layers \[1, 2, 3, 99\]"),
    (lambda i: _tensor(i, "model.layers.0.input_layernorm.weight").update(shape=[96, 1], nbytes=96 * 4),
     r"has shape \[96, 1\]; a norm's weight is a vector"),
    (lambda i: i["tensors"].remove(_tensor(i, "model.layers.0.self_attn.o_proj.weight")),
     "o_proj.weight', which the qwen3_moe runtime reads"),
])
def test_the_fuzz_finds_on_a_stored_index_are_named(capsys: pytest.CaptureFixture[str], pulled: Path,
                                                    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, edit: Any,
                                                    message: str) -> None:
    home = tmp_path / "ft_home"
    shutil.copytree(pulled, home)
    monkeypatch.setenv("FT_HOME", str(home))
    store = Store(home)
    layer = next(d for d in store.read_manifest("tiny").layers if d.media_type == MEDIA_FTW_INDEX)
    index = json.loads(store.blob_path(layer.digest).read_bytes())
    edit(index)
    _store_mutated_index(store, "damaged", index)
    code, _, err = ft(capsys, "run", "--num-predict", "1", "damaged", "hi")
    _assert_typed_refusal("damaged", code, err)
    assert re.search(message, err) and "damaged:latest: model.ftw.json" in err, err
    assert "run `ft rm damaged:latest` and `ft pull damaged:latest`" in err, err
