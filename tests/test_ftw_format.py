"""FTW writer state machine and reader validation: bad files are refused with the culprit named."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from ftw import (
    CorruptIndexError,
    CorruptShardError,
    FTWReader,
    FTWWriter,
    UnsupportedVersionError,
    WriterStateError,
)
from ftw.format import INDEX_FILENAME
from ftw.sink import DiskFullError


def tensor_bytes(t: torch.Tensor) -> np.ndarray:
    return t.contiguous().view(torch.uint8).numpy()


def write_small(out: Path, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
    emb = torch.randn(10, 6)
    experts = torch.randn(3, 8, 6).to(torch.bfloat16)
    w = FTWWriter(out, **kwargs)
    w.add_tensor("emb", "f32", (10, 6), [tensor_bytes(emb)])
    with w.expert_bank(0, 3, [("w13", "bf16", (8, 6)), ("w2", "bf16", (6, 4))]) as bank:
        for e in range(3):
            bank.write_expert(e, {"w13": tensor_bytes(experts[e]), "w2": tensor_bytes(experts[e, :6, :4].contiguous())})
    w.finish(family="test", config={"a": 1}, source_config={}, metadata={})
    return emb, experts


def test_write_read_and_read_into_caller_buffer(tmp_path: Path) -> None:
    emb, experts = write_small(tmp_path)
    with FTWReader.open(tmp_path) as r:
        assert torch.equal(r.tensor("emb"), emb)
        bank = r.index.bank(0)
        buf = torch.zeros(bank.nbytes, dtype=torch.uint8)
        data = r.bank_bytes(0, out=buf)
        assert data.data_ptr() == buf.data_ptr()  # straight into the caller's memory
        for e in range(3):
            assert torch.equal(r.expert_part(data, bank, e, "w13"), experts[e])
        r.verify()


def test_writer_refuses_steps_out_of_order(tmp_path: Path) -> None:
    w = FTWWriter(tmp_path)
    x = tensor_bytes(torch.zeros(2))
    with pytest.raises(WriterStateError, match="expert 1 written, expected expert 0"):
        with w.expert_bank(0, 2, [("w", "f32", (2,))]) as bank:
            bank.write_expert(1, {"w": x})
    with pytest.raises(WriterStateError, match="bank closed after 1 of 2"):
        with w.expert_bank(1, 2, [("w", "f32", (2,))]) as bank:
            bank.write_expert(0, {"w": x})
    with pytest.raises(WriterStateError, match="while an expert bank is open"):
        with w.expert_bank(2, 1, [("w", "f32", (2,))]):
            w.add_tensor("t", "f32", (2,), [x])
    with pytest.raises(WriterStateError, match="8 expected"):
        w.add_tensor("short", "f32", (2,), [x[:4]])
    w.add_tensor("ok", "f32", (2,), [x])
    with pytest.raises(WriterStateError, match="written twice"):
        w.add_tensor("ok", "f32", (2,), [x])
    w.finish(family="t", config={}, source_config={})
    with pytest.raises(WriterStateError, match="finished"):
        w.add_tensor("late", "f32", (2,), [x])


def edit_index(directory: Path, edit) -> None:
    path = directory / INDEX_FILENAME
    doc = json.loads(path.read_text())
    edit(doc)
    path.write_text(json.dumps(doc))


@pytest.mark.parametrize(
    "edit, error, message",
    [
        (lambda d: d.update(version=99), UnsupportedVersionError, "version 99 is not supported"),
        (lambda d: d.update(format="gguf"), CorruptIndexError, "not an FTW index"),
        (lambda d: d["tensors"][0].update(offset=4096 * 1000), CorruptIndexError, "past the end of model-00001.ftw"),
        (lambda d: d["tensors"][0].update(offset=100), CorruptIndexError, "not 4096-aligned"),
        (lambda d: d["tensors"][0].update(shape=[11, 6]), CorruptIndexError, "needs"),
        (lambda d: d["banks"][0].update(offset=0), CorruptIndexError, "overlap"),
        (lambda d: d["tensors"][0].update(dtype="q9_z"), CorruptIndexError, "unknown"),
        (lambda d: d["tensors"][0].update(offset="0"), CorruptIndexError, "wrong type"),
        (lambda d: d["shards"][0].update(name="../../etc/passwd"), CorruptIndexError, "plain file name"),
        (lambda d: d["banks"][0]["parts"][1].update(offset=0), CorruptIndexError, "overlaps"),
        (lambda d: d["banks"][0].update(activation={"kind": "gelu"}), CorruptIndexError, "kind 'gelu' is unknown"),
        (lambda d: d["banks"][0].update(activation={"kind": "swiglu_clamped", "alpha": 1.7}), CorruptIndexError,
         "without its limit"),
        (lambda d: d["banks"][0].update(activation={"kind": "swiglu_clamped", "limit": -7}), CorruptIndexError,
         "limit is -7, not a finite number above 0"),
    ],
)
def test_reader_rejects_bad_index(tmp_path: Path, edit, error, message: str) -> None:
    write_small(tmp_path)
    edit_index(tmp_path, edit)
    with pytest.raises(error, match=message):
        FTWReader.open(tmp_path)


def test_a_banks_activation_is_kept_and_plain_swiglu_is_not_written(tmp_path: Path) -> None:
    """gpt-oss's clamped SwiGLU travels with its bank; a plain SwiGLU bank's JSON is as it was
    before banks had an activation."""
    from ftw.format import SWIGLU, ExpertActivation

    clamped = ExpertActivation("swiglu_clamped", alpha=1.702, limit=7.0)
    for out, activation in ((tmp_path / "plain", SWIGLU), (tmp_path / "clamped", clamped)):
        w = FTWWriter(out)
        with w.expert_bank(0, 1, [("w13", "f32", (4, 2)), ("w2", "f32", (2, 2))], activation=activation) as bank:
            bank.write_expert(0, {"w13": tensor_bytes(torch.zeros(4, 2)), "w2": tensor_bytes(torch.zeros(2, 2))})
        w.finish(family="test", config={}, source_config={}, metadata={})
        with FTWReader.open(out) as r:
            assert r.index.bank(0).activation == activation
        assert ("activation" in json.loads((out / INDEX_FILENAME).read_text())["banks"][0]) == (activation != SWIGLU)


def test_index_not_json(tmp_path: Path) -> None:
    write_small(tmp_path)
    (tmp_path / INDEX_FILENAME).write_bytes(b"\x00\xff garbage")
    with pytest.raises(CorruptIndexError, match="not valid JSON"):
        FTWReader.open(tmp_path)
    (tmp_path / INDEX_FILENAME).write_bytes(b"[" * 200_000 + b"]" * 200_000)  # deeper than the parser recurses
    with pytest.raises(CorruptIndexError, match="not valid JSON"):
        FTWReader.open(tmp_path)


def test_truncated_shard_is_named(tmp_path: Path) -> None:
    write_small(tmp_path)
    shard = tmp_path / "model-00001.ftw"
    os.truncate(shard, shard.stat().st_size - 4096)
    with pytest.raises(CorruptShardError, match="model-00001.ftw .* truncated"):
        FTWReader.open(tmp_path)


def test_corrupt_shard_is_named_by_verify(tmp_path: Path) -> None:
    write_small(tmp_path)
    shard = tmp_path / "model-00001.ftw"
    data = bytearray(shard.read_bytes())
    data[5000] ^= 0xFF
    shard.write_bytes(bytes(data))
    reader = FTWReader.open(tmp_path)  # layout is fine; only the hash can tell
    with pytest.raises(CorruptShardError, match="model-00001.ftw .* sha256"):
        reader.verify()


def test_disk_full_is_reported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_write = os.write
    budget = {"left": 8192}

    def failing_write(fd: int, data) -> int:
        if budget["left"] <= 0:
            raise OSError(errno.ENOSPC, "No space left on device")
        budget["left"] -= len(data)
        return real_write(fd, data)

    monkeypatch.setattr("ftw.sink.os.write", failing_write)
    w = FTWWriter(tmp_path)
    with pytest.raises(DiskFullError, match="disk full while writing .*model-00001.ftw"):
        for i in range(64):
            w.add_tensor(f"t{i}", "f32", (4096,), [tensor_bytes(torch.zeros(4096))])
        w.finish(family="t", config={}, source_config={})
    w.abort()
    assert not (tmp_path / INDEX_FILENAME).exists()


def test_direct_io_into_page_aligned_buffers(tmp_path: Path) -> None:
    from ftw.reader import page_aligned_empty

    emb, experts = write_small(tmp_path)
    with FTWReader.open(tmp_path) as r:
        bank = r.index.bank(0)
        buf = page_aligned_empty(bank.nbytes)
        data = r.bank_bytes(0, out=buf)
        assert (r.shard_paths["model-00001.ftw"], True) and r._fds.get(("model-00001.ftw", True)) is not None
        for e in range(3):
            assert torch.equal(r.expert_part(data, bank, e, "w13"), experts[e])
        entry = r.index.tensor("emb")  # 240 bytes: shorter than a page, read through the page cache
        out = page_aligned_empty(entry.nbytes)
        r.read_into(entry.shard, entry.offset, memoryview(out.numpy()))
        assert torch.equal(out.view(torch.float32).view(10, 6), emb)
