"""A stored manifest (and the FTW index it names) mutated never crashes ft or slips past it: each
mutation ends in a model that loads (`ft verify` ok, `ft show` ok, the FTW reader opens it) or in a
typed error, exit status 1, no traceback, naming the file and the fix. The mutations are generated
from a fixed seed; the default run is bounded (DEFAULT_CASES), `-m fuzz_full` sweeps FULL_CASES."""

from __future__ import annotations

import copy
import json
import random
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from ftw.errors import CorruptIndexError
from registry import InvalidModelManifestError, Store
from registry.model_manifest import (
    MEDIA_CONFIG,
    MEDIA_FILE,
    MEDIA_FTW_INDEX,
    MEDIA_FTW_SHARD,
    MEDIA_MODELFILE,
)
from runtime.loading.registered import open_model
from tests import store_fixtures
from tests.clirun import ft

pulled, home = store_fixtures.pulled, store_fixtures.home  # the shared store fixtures

SEED = 26  # the number: a failure names its case, and the case comes back the same
DEFAULT_CASES = 150
FULL_CASES = 3000

Doc = dict[str, Any]


def _store_index(store: Store, doc: Doc, index: Doc) -> None:
    """Store `index` as a blob and point `doc`'s index layer at it (a consistent store whose
    index says something else)."""
    ref = store.add_blob_bytes(json.dumps(index).encode())
    layer = next(d for d in doc["layers"] if d.get("mediaType") == MEDIA_FTW_INDEX)
    layer.update(digest=ref.digest, size=ref.size)


def _index_of(store: Store, doc: Doc) -> Doc:
    layer = next(d for d in doc["layers"] if d["mediaType"] == MEDIA_FTW_INDEX)
    return json.loads(store.blob_path(layer["digest"]).read_bytes())


def _check_outcome(home: Path, capsys: pytest.CaptureFixture[str], what: str) -> bool:
    """Verify and show the stored tiny; True if it is whole (and then it must load)."""
    code, out, err = ft(capsys, "verify", "tiny")
    assert code in (0, 1), (what, code, err)
    assert "Traceback" not in err, (what, err)
    show_code, _, show_err = ft(capsys, "show", "tiny")
    assert show_code in (0, 1) and "Traceback" not in show_err, (what, show_err)
    if code == 1:
        assert "tiny" in err or "latest" in err, (what, err)  # names the model or its manifest file
        assert "`ft " in err, (what, err)  # and the command that fixes it
        assert show_code == 0 or "`ft " in show_err, (what, show_err)
        return False
    assert "tiny: ok" in out and show_code == 0, (what, out, show_err)
    model = open_model(Store(home), "tiny")
    model.check_files()
    with model.open_ftw() as reader:
        assert reader.index.shards
    return True


# ---- the cases the fault run found accepted ----------------------------------------------------------

def _without(media_type: str) -> Callable[[Doc], None]:
    def mutate(doc: Doc) -> None:
        doc["layers"] = [d for d in doc["layers"] if d["mediaType"] != media_type]
    return mutate


def _second_index(doc: Doc) -> None:
    index = next(d for d in doc["layers"] if d["mediaType"] == MEDIA_FTW_INDEX)
    doc["layers"].append(copy.deepcopy(index) | {"annotations": {"org.opencontainers.image.title": "b.json"}})


def _untitled_shard(doc: Doc) -> None:
    next(d for d in doc["layers"] if d["mediaType"] == MEDIA_FTW_SHARD).pop("annotations")


def _twice_listed(doc: Doc) -> None:
    doc["layers"].append(copy.deepcopy(doc["layers"][-1]))


SHAPE_CASES: dict[str, tuple[Callable[[Doc], None], str]] = {
    "empty layers": (lambda doc: doc.update(layers=[]), "layers: the list is empty"),
    "no index": (_without(MEDIA_FTW_INDEX), "no layer is the FTW index"),
    "no shard": (_without(MEDIA_FTW_SHARD), "no layer is an FTW shard"),
    "two indexes": (_second_index, "are all FTW indexes"),
    "index retyped as a file": (lambda doc: doc["layers"][0].update(mediaType=MEDIA_FILE), "no layer is the FTW index"),
    "shard untitled": (_untitled_shard, "annotations: lacks 'org.opencontainers.image.title'"),
    "a file listed twice": (_twice_listed, "is listed 2 times"),
}


@pytest.mark.parametrize("case", list(SHAPE_CASES))
def test_a_manifest_without_a_model_shape_is_refused(home: Path, capsys: pytest.CaptureFixture[str],
                                                     case: str) -> None:
    store = Store(home)
    path = store.manifest_path("tiny")
    doc = json.loads(path.read_bytes())
    assert doc["config"]["mediaType"] == MEDIA_CONFIG
    mutate, needle = SHAPE_CASES[case]
    mutate(doc)
    path.write_text(json.dumps(doc))
    with pytest.raises(InvalidModelManifestError, match=needle) as caught:
        store.read_manifest("tiny")
    assert str(path) in str(caught.value) and "`ft rm tiny:latest`" in str(caught.value)
    assert caught.value.field.startswith("layers")
    for args in (("verify", "tiny"), ("show", "tiny"), ("cp", "tiny", "copy")):
        code, _, err = ft(capsys, *args)
        assert code == 1 and needle in err and str(path) in err and "Traceback" not in err, (args, err)
    code, out, err = ft(capsys, "list")
    assert code == 0 and "tiny" not in out and "skipped unreadable manifest" in err
    named = {f"sha256:{d}" for d in re.findall(r"sha256:([0-9a-f]{64})", path.read_text())}
    assert store.unreferenced_bytes(among=named) == 0  # gc keeps the blobs a refused manifest names
    assert ft(capsys, "rm", "tiny")[0] == 0  # the fix it names works


def _index_shard(mutate: Callable[[Doc], None]) -> Callable[[Store, Doc], None]:
    def apply(store: Store, doc: Doc) -> None:
        index = _index_of(store, doc)
        mutate(index)
        _store_index(store, doc, index)
    return apply


def _shard_layer_retyped(store: Store, doc: Doc) -> None:
    next(d for d in doc["layers"] if d["mediaType"] == MEDIA_FTW_SHARD).update(mediaType=MEDIA_FILE)
    doc["layers"].append({"mediaType": MEDIA_FTW_SHARD, "digest": doc["layers"][3]["digest"],
                          "size": doc["layers"][3]["size"], "annotations": {"org.opencontainers.image.title": "x.ftw"}})


INDEX_CASES: dict[str, tuple[Callable[[Store, Doc], None], str]] = {
    "index sha256 differs": (_index_shard(lambda ix: ix["shards"][0].update(sha256="ab" * 32)), "sha256 is abab"),
    "index sha256 of another blob": (
        _index_shard(lambda ix: ix["shards"][0].update(sha256="5c5079bd48cefaa54b3285ef62c2e345ce30f6e66ab8ec6f3f255a2178b914ae")),
        ".sha256 is 5c5079"),
    "index size differs": (_index_shard(lambda ix: ix["shards"][0].update(size=ix["shards"][0]["size"] + 4096)),
                           ".size is"),
    "index names a shard the manifest lacks": (_index_shard(lambda ix: ix["shards"][0].update(name="other.ftw")),
                                               "no shard layer of the manifest"),
    "index names a shard twice": (_index_shard(lambda ix: ix["shards"].append(dict(ix["shards"][0]))),
                                  "names this shard 2 times"),
    "the shard layer is another blob": (_shard_layer_retyped, "not name"),
}


@pytest.mark.parametrize("case", list(INDEX_CASES))
def test_verify_holds_the_index_against_the_manifest(home: Path, capsys: pytest.CaptureFixture[str],
                                                      case: str) -> None:
    store = Store(home)
    path = store.manifest_path("tiny")
    doc = json.loads(path.read_bytes())
    mutate, needle = INDEX_CASES[case]
    mutate(store, doc)
    path.write_text(json.dumps(doc))
    assert store.verify("tiny") == []  # every blob hashes right: only the cross-check sees it
    code, _, err = ft(capsys, "verify", "tiny")
    assert code == 1 and needle in err and "Traceback" not in err, err
    assert "model.ftw.json" in err and "`ft rm tiny` and `ft pull tiny`" in err, err
    code, out, _ = ft(capsys, "verify", "--json", "tiny")
    assert code == 1 and json.loads(out)["tiny"][0]["problem"] == "disagrees"


# ---- generated mutations -------------------------------------------------------------------------

ODD_VALUES: list[Any] = [None, 0, -1, 1.5, True, "", "x", [], {}, 2**70, "sha256:" + "0" * 64, {"a": [1]}]
MEDIA_TYPES = [MEDIA_CONFIG, MEDIA_FTW_INDEX, MEDIA_FTW_SHARD, MEDIA_FILE, MEDIA_MODELFILE, "text/plain"]


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Every key path into a JSON tree (dict keys and list positions)."""
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for key, child in items:
        yield (*prefix, key)
        yield from _paths(child, (*prefix, key))


def _parent(doc: Any, path: tuple[Any, ...]) -> Any:
    for key in path[:-1]:
        doc = doc[key]
    return doc


def _mutate_tree(rng: random.Random, store: Store, doc: Doc) -> str:
    """One mutation of the parsed manifest (or of the index it names); returns its description."""
    layers = doc.get("layers") if isinstance(doc.get("layers"), list) else []
    kind = rng.choice(["drop", "retype", "drop_layer", "dup_layer", "swap", "media", "digest", "size",
                       "title", "index", "extra", "reorder"])
    paths = list(_paths(doc))
    if kind == "drop" and paths:
        path = rng.choice(paths)
        _parent(doc, path).pop(path[-1])
        return f"drop {path}"
    if kind == "retype" and paths:
        path = rng.choice(paths)
        value = rng.choice(ODD_VALUES)
        _parent(doc, path)[path[-1]] = copy.deepcopy(value)
        return f"set {path} = {value!r}"
    good = [d for d in layers if isinstance(d, dict)]
    if kind == "drop_layer" and layers:
        return f"drop layer {layers.pop(rng.randrange(len(layers)))!r:.60}"
    if kind == "dup_layer" and layers:
        i = rng.randrange(len(layers))
        layers.insert(rng.randrange(len(layers) + 1), copy.deepcopy(layers[i]))
        return f"duplicate layer {i}"
    if kind == "swap" and len(good) >= 2:
        a, b = rng.sample(good, 2)
        key = rng.choice(["digest", "size", "mediaType", "annotations"])
        a[key], b[key] = b.get(key), a.get(key)
        return f"swap {key} of two layers"
    if kind == "media" and good:
        value = rng.choice(MEDIA_TYPES)
        rng.choice(good)["mediaType"] = value
        return f"mediaType = {value}"
    blobs = [d for d in [doc.get("config"), *good] if isinstance(d, dict)]
    if kind == "digest" and blobs:
        target = rng.choice(blobs)
        other = rng.choice(blobs).get("digest")
        flipped = "sha256:" + "".join(rng.choice("0123456789abcdef") for _ in range(64))
        target["digest"] = rng.choice([other, flipped, str(target.get("digest", "")).upper()])
        return f"digest = {target['digest']!r:.20}"
    if kind == "size" and blobs:
        target = rng.choice(blobs)
        size = target.get("size") if isinstance(target.get("size"), int) else 0
        target["size"] = rng.choice([size + 1, size - 1, 0, size * 2, -5])
        return f"size = {target['size']}"
    if kind == "title" and good:
        titles = [d.get("annotations", {}).get("org.opencontainers.image.title") for d in good
                  if isinstance(d.get("annotations"), dict)]
        value = rng.choice([*titles, "", "../../etc/passwd", "model.ftw.json", "x" * 300])
        rng.choice(good)["annotations"] = {"org.opencontainers.image.title": value}
        return f"title = {value!r:.40}"
    if kind == "index" and good:
        try:
            index = _index_of(store, doc)
        except (StopIteration, KeyError, TypeError, OSError, ValueError):
            return "index (unreachable)"
        shard = rng.choice(index["shards"]) if index.get("shards") else {}
        change = rng.choice(["sha256", "size", "name", "drop", "dup"])
        if change == "sha256":
            shard["sha256"] = rng.choice(["0" * 64, "ab" * 32, str(shard.get("sha256", ""))[::-1]])
        elif change == "size":
            shard["size"] = rng.choice([0, 4096, int(shard.get("size", 0)) + 4096, int(shard.get("size", 0)) - 4096])
        elif change == "name":
            shard["name"] = rng.choice(["model-00002.ftw", "tokenizer.json", "Modelfile"])
        elif change == "drop":
            index["shards"] = []
        else:
            index.setdefault("shards", []).append(dict(shard))
        _store_index(store, doc, index)
        return f"index shard {change}"
    if kind == "extra":
        target = rng.choice([doc, *blobs])
        target["x-extra"] = rng.choice(ODD_VALUES)
        return "extra key"
    if kind == "reorder" and layers:
        rng.shuffle(layers)
        return "reorder layers"
    return "no change"


def _mutate_bytes(rng: random.Random, data: bytes) -> tuple[bytes, str]:
    i = rng.randrange(len(data))
    kind = rng.choice(["truncate", "flip", "insert", "nest"])
    if kind == "truncate":
        return data[:i], f"truncate at {i}"
    if kind == "flip":
        return data[:i] + bytes([data[i] ^ (1 << rng.randrange(8))]) + data[i + 1:], f"flip a bit of byte {i}"
    if kind == "insert":
        return data[:i] + rng.choice([b"\x00", b"\xff\xfe", b"}", b",", b'"']) + data[i:], f"insert at {i}"
    return b"[" * 100_000 + b"]" * 100_000, "nested 100000 deep"


def _cases(count: int) -> Iterator[tuple[int, random.Random]]:
    for n in range(count):
        yield n, random.Random(f"{SEED}-{n}")


def _run_cases(home: Path, capsys: pytest.CaptureFixture[str], count: int) -> dict[str, int]:
    store = Store(home)
    path = store.manifest_path("tiny")
    original = path.read_bytes()
    outcomes = {"loads": 0, "refused": 0}
    for n, rng in _cases(count):
        doc = json.loads(original)
        if rng.random() < 0.2:
            data, what = _mutate_bytes(rng, original)
        else:
            what = "; ".join(_mutate_tree(rng, store, doc) for _ in range(rng.choice([1, 1, 2])))
            data = json.dumps(doc).encode()
        path.write_bytes(data)
        try:
            whole = _check_outcome(home, capsys, f"case {n}: {what}")
        except (AssertionError, pytest.fail.Exception):
            raise
        except Exception as e:  # a crash: name the case that makes it
            pytest.fail(f"case {n} ({what}) crashed: {e!r}")
        outcomes["loads" if whole else "refused"] += 1
        path.write_bytes(original)
    return outcomes


def test_generated_manifest_mutations(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    outcomes = _run_cases(home, capsys, DEFAULT_CASES)
    assert outcomes["refused"] > DEFAULT_CASES // 2 and outcomes["loads"] > 0, outcomes  # the mutations bite


@pytest.mark.fuzz_full
def test_generated_manifest_mutations_full_sweep(home: Path, capsys: pytest.CaptureFixture[str],
                                                 request: pytest.FixtureRequest) -> None:
    if "fuzz_full" not in (request.config.getoption("markexpr") or ""):
        pytest.skip("the full sweep runs with -m fuzz_full")
    outcomes = _run_cases(home, capsys, FULL_CASES)
    assert outcomes["refused"] > FULL_CASES // 2, outcomes


def test_verify_reports_every_failing_check_of_the_index_not_only_the_first(
        home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A norm made a matrix and an expert bank of too many experts (whose records then overlap the
    next tensor): a load stops at the first problem, `ft verify` names all three, the layout's
    first, one line each, and `--json` lists them."""
    store = Store(home)
    path = store.manifest_path("tiny")
    doc = json.loads(path.read_bytes())
    index = _index_of(store, doc)
    norm = next(t for t in index["tensors"] if t["name"].endswith("input_layernorm.weight"))
    norm["shape"] = [*norm["shape"], 1]
    index["banks"][0]["num_experts"] += 1
    _store_index(store, doc, index)
    path.write_text(json.dumps(doc))
    code, _, err = ft(capsys, "verify", "tiny")
    assert code == 1 and "Traceback" not in err, err
    assert "a norm's weight is a vector" in err and "the expert bank of layer" in err, err
    code, out, _ = ft(capsys, "verify", "--json", "tiny")
    problems = json.loads(out)["tiny"]
    assert code == 1 and len(problems) == 3, problems  # the extra expert's bytes also overlap a tensor: the layout's
    assert "overlap" in problems[0]["detail"], problems
    with pytest.raises(CorruptIndexError, match="overlap"):
        open_model(store, "tiny").open_ftw()
