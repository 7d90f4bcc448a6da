"""FTWReader: validates an FTW index against its shards and reads tensors and expert banks.

Block-quantized (GGML) tensors and parts come back as their raw bytes, uint8 of
`format.storage_shape(dtype, shape)` = `[*shape[:-1], row_bytes]`; the runtime dequantizes them.

Opening checks the layout only (sizes, bounds, alignment, no overlaps), which costs nothing
per byte; `verify()` re-hashes the shards. The registry hashes every blob when it is stored
and `ft verify` re-hashes on demand, so the runtime's load path need not hash again.
"""

from __future__ import annotations

import errno
import hashlib
import mmap
import os
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np
import torch

from .errors import CorruptIndexError, CorruptShardError
from .format import (
    ALIGNMENT,
    DTYPE_ITEMSIZE,
    INDEX_FILENAME,
    ExpertBank,
    Index,
    TensorEntry,
    nbytes_of,
    storage_shape,
)
from .rangeio import pread_into

TORCH_DTYPES: dict[str, torch.dtype] = {
    "f32": torch.float32,
    "f16": torch.float16,
    "bf16": torch.bfloat16,
    "f8_e4m3": torch.float8_e4m3fn,
    "f8_e5m2": torch.float8_e5m2,
    "f8_e8m0": torch.float8_e8m0fnu,
    "i64": torch.int64,
    "i32": torch.int32,
    "i16": torch.int16,
    "i8": torch.int8,
    "u8": torch.uint8,
    "bool": torch.bool,
}

READ_CHUNK_BYTES = 64 << 20
USE_DIRECT_IO = os.environ.get("FT_DIRECT_IO", "1") != "0"


def torch_dtype_of(dtype: str) -> torch.dtype:
    """The torch dtype the reader returns for an FTW dtype (uint8 for block-quantized ones)."""
    return TORCH_DTYPES.get(dtype, torch.uint8)


def _expected_nbytes(dtype: str, shape: tuple[int, ...]) -> int | None:
    try:
        return nbytes_of(dtype, shape)
    except (KeyError, ValueError):
        return None  # unknown dtype, or a block-quantized row that is not whole blocks


def check_layout(index: Index, origin: str = INDEX_FILENAME) -> None:
    """Raise CorruptIndexError unless every range is aligned, in bounds and disjoint."""
    shards = {s.name: s for s in index.shards}
    if len(shards) != len(index.shards):
        raise CorruptIndexError(f"{origin}: a shard is listed twice")
    ranges: dict[str, list[tuple[int, int, str]]] = {name: [] for name in shards}

    def claim(shard: str, offset: int, nbytes: int, what: str) -> None:
        if shard not in shards:
            raise CorruptIndexError(f"{origin}: {what} refers to unknown shard {shard!r}")
        if offset % ALIGNMENT:
            raise CorruptIndexError(f"{origin}: {what} starts at {offset}, not {ALIGNMENT}-aligned")
        if offset + nbytes > shards[shard].size:
            raise CorruptIndexError(
                f"{origin}: {what} ends at byte {offset + nbytes}, past the end of {shard} ({shards[shard].size} bytes)"
            )
        ranges[shard].append((offset, offset + nbytes, what))

    names: set[str] = set()
    for t in index.tensors:
        if t.name in names:
            raise CorruptIndexError(f"{origin}: tensor {t.name!r} is listed twice")
        names.add(t.name)
        if (expected := _expected_nbytes(t.dtype, t.shape)) != t.nbytes:
            raise CorruptIndexError(f"{origin}: tensor {t.name!r} is {t.nbytes} bytes but {t.dtype}{list(t.shape)} needs {expected}")
        claim(t.shard, t.offset, t.nbytes, f"tensor {t.name!r}")
    layers: set[int] = set()
    for b in index.banks:
        what = f"expert bank of layer {b.layer}"
        if b.layer in layers:
            raise CorruptIndexError(f"{origin}: {what} is listed twice")
        layers.add(b.layer)
        if b.num_experts < 1 or b.expert_stride < 1 or b.expert_stride % ALIGNMENT:
            raise CorruptIndexError(f"{origin}: {what} has {b.num_experts} experts of stride {b.expert_stride}")
        end = 0
        for p in sorted(b.parts, key=lambda p: p.offset):
            if _expected_nbytes(p.dtype, p.shape) != p.nbytes or p.offset < end:
                raise CorruptIndexError(f"{origin}: {what} part {p.name!r} is inconsistent or overlaps")
            end = p.offset + p.nbytes
        if end > b.expert_stride:
            raise CorruptIndexError(f"{origin}: {what} parts need {end} bytes, stride is {b.expert_stride}")
        claim(b.shard, b.offset, b.nbytes, what)
    for shard, spans in ranges.items():
        spans.sort()
        for (_, end, a), (start, _, b) in zip(spans, spans[1:], strict=False):
            if start < end:
                raise CorruptIndexError(f"{origin}: {a} and {b} overlap in {shard}")


class FTWReader:
    """Read access to one FTW model. `shard_paths` maps shard names to files (default: beside the index)."""

    def __init__(self, index: Index, shard_paths: Mapping[str, Path], *, origin: str = INDEX_FILENAME) -> None:
        check_layout(index, origin)
        self.index = index
        self.shard_paths = {s.name: Path(shard_paths[s.name]) for s in index.shards if s.name in shard_paths}
        for s in index.shards:
            path = self.shard_paths.get(s.name)
            if path is None:
                raise CorruptShardError(f"shard {s.name} of {origin} has no file; run `ft verify` and re-pull the model")
            try:
                size = path.stat().st_size
            except OSError:
                raise CorruptShardError(f"shard {s.name} is missing ({path}); run `ft verify` and re-pull the model") from None
            if size != s.size:
                raise CorruptShardError(
                    f"shard {s.name} ({path}) is {size} bytes, the index says {s.size}: the file is truncated "
                    "or damaged; run `ft verify` and re-pull the model"
                )
        self._fds: dict[tuple[str, bool], int | None] = {}

    @classmethod
    def open(cls, directory: Path) -> FTWReader:
        """Open an FTW directory as the writer left it (index and shards side by side)."""
        directory = Path(directory)
        path = directory / INDEX_FILENAME
        try:
            text = path.read_bytes()
        except FileNotFoundError:
            raise CorruptIndexError(f"{path} does not exist: not an FTW directory") from None
        index = Index.from_json(text, origin=str(path))
        return cls(index, {s.name: directory / s.name for s in index.shards}, origin=str(path))

    def close(self) -> None:
        for fd in self._fds.values():
            if fd is not None:
                os.close(fd)
        self._fds.clear()

    def __enter__(self) -> FTWReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- reading ------------------------------------------------------------------------------

    def _fd(self, shard: str, direct: bool = False) -> int | None:
        """The shard's file descriptor; with `direct`, an O_DIRECT one (None if unsupported)."""
        key = (shard, direct)
        if key not in self._fds:
            flags = os.O_RDONLY | (getattr(os, "O_DIRECT", 0) if direct else 0)
            try:
                self._fds[key] = os.open(self.shard_paths[shard], flags)
            except OSError:
                if not direct:
                    raise
                self._fds[key] = None  # e.g. tmpfs: no O_DIRECT; buffered reads it is
        return self._fds[key]

    def read_into(self, shard: str, offset: int, out: memoryview) -> None:
        """Fill `out` with bytes from `shard` at `offset`.

        When `out` starts on a page boundary (pinned memory does; see `page_aligned_empty`), the
        aligned bulk is read with O_DIRECT: the device writes straight into `out`, with no copy
        through the page cache, and the weights do not also fill the page cache. The rest, and
        unaligned buffers, use ordinary large preads.
        """
        total = out.nbytes
        done = 0
        if USE_DIRECT_IO and offset % ALIGNMENT == 0 and _address(out) % ALIGNMENT == 0 and total >= ALIGNMENT:
            fd = self._fd(shard, direct=True)
            if fd is not None:
                try:
                    done = pread_into(fd, out[: total - total % ALIGNMENT], offset, self._ended_early(shard))
                except OSError as e:
                    if e.errno != errno.EINVAL:
                        raise
                    os.close(fd)
                    self._fds[(shard, True)] = None  # the filesystem refuses O_DIRECT after all
        if done < total:
            fd = self._fd(shard)
            assert fd is not None
            pread_into(fd, out[done:], offset + done, self._ended_early(shard))

    @staticmethod
    def _ended_early(shard: str) -> Callable[[int], Exception]:
        return lambda position: CorruptShardError(f"shard {shard} ended early at byte {position}; run `ft verify`")

    def in_file_order(self) -> list[TensorEntry | ExpertBank]:
        """Every dense tensor and bank, sorted by (shard, offset): load in this order so the
        reads are one sequential pass over each shard (kernel readahead stays effective)."""
        shard_rank = {s.name: i for i, s in enumerate(self.index.shards)}
        items: list[TensorEntry | ExpertBank] = [*self.index.tensors, *self.index.banks]
        return sorted(items, key=lambda item: (shard_rank[item.shard], item.offset))

    def tensor(self, name: str, out: torch.Tensor | None = None) -> torch.Tensor:
        """Read a dense tensor (into `out` when given: same dtype and shape, contiguous).

        A block-quantized tensor comes back as uint8 `[*shape[:-1], row_bytes]`, its raw bytes."""
        return self._read_entry(self.index.tensor(name), out)

    def _read_entry(self, entry: TensorEntry, out: torch.Tensor | None) -> torch.Tensor:
        dtype, shape = torch_dtype_of(entry.dtype), storage_shape(entry.dtype, entry.shape)
        if out is None:
            out = torch.empty(shape, dtype=dtype)
        elif out.dtype != dtype or tuple(out.shape) != shape or not out.is_contiguous():
            raise ValueError(f"{entry.name}: out must be contiguous {dtype}{list(shape)}")
        if entry.nbytes:
            self.read_into(entry.shard, entry.offset, _byte_view(out))
        return out

    def bank_bytes(self, layer: int, out: torch.Tensor | None = None) -> torch.Tensor:
        """Read the whole expert bank of `layer` as uint8 [num_experts, expert_stride].

        `out` may be any contiguous uint8 tensor of that size, e.g. pinned host memory; the
        bytes land there directly, with no intermediate copy.
        """
        bank = self.index.bank(layer)
        if out is None:
            out = torch.empty((bank.num_experts, bank.expert_stride), dtype=torch.uint8)
        elif out.dtype != torch.uint8 or out.numel() != bank.nbytes or not out.is_contiguous():
            raise ValueError(f"layer {layer}: out must be a contiguous uint8 tensor of {bank.nbytes} bytes")
        self.read_into(bank.shard, bank.offset, _byte_view(out))
        return out.view(bank.num_experts, bank.expert_stride)

    def expert_part(self, bank_bytes: torch.Tensor, bank: ExpertBank, expert: int, part: str) -> torch.Tensor:
        """A typed view of one part of one expert inside bytes returned by `bank_bytes`
        (block-quantized parts: their raw bytes, uint8 `[*shape[:-1], row_bytes]`)."""
        p = bank.part(part)
        record = bank_bytes.view(-1)[expert * bank.expert_stride : (expert + 1) * bank.expert_stride]
        raw = record[p.offset : p.offset + p.nbytes]
        return raw.view(torch_dtype_of(p.dtype)).view(storage_shape(p.dtype, p.shape))

    # -- integrity ----------------------------------------------------------------------------

    def verify(self, progress: Callable[[int], None] | None = None) -> None:
        """Re-hash every shard; raise CorruptShardError naming the first bad one."""
        buf = bytearray(READ_CHUNK_BYTES)
        view = memoryview(buf)
        for s in self.index.shards:
            h = hashlib.sha256()
            with open(self.shard_paths[s.name], "rb", buffering=0) as f:
                while n := f.readinto(view):
                    h.update(view[:n])
                    if progress:
                        progress(n)
            if h.hexdigest() != s.sha256:
                raise CorruptShardError(
                    f"shard {s.name} ({self.shard_paths[s.name]}) does not match its sha256: the file is corrupt; "
                    "re-pull the model"
                )


def page_aligned_empty(nbytes: int) -> torch.Tensor:
    """A uint8 CPU tensor of `nbytes` starting on a page boundary (anonymous mmap), so
    `read_into` can fill it with O_DIRECT. Pinned CUDA host memory is page-aligned already."""
    region = mmap.mmap(-1, max(nbytes, 1))
    return torch.frombuffer(region, dtype=torch.uint8, count=nbytes) if nbytes else torch.empty(0, dtype=torch.uint8)


def _address(view: memoryview) -> int:
    return int(np.frombuffer(view, dtype=np.uint8).ctypes.data) if view.nbytes else 0


def _byte_view(t: torch.Tensor) -> memoryview:
    """A writable byte view of a contiguous CPU tensor (works for every dtype incl. bf16/fp8)."""
    return memoryview(t.reshape(-1).view(torch.uint8).numpy()).cast("B")


assert set(TORCH_DTYPES) == set(DTYPE_ITEMSIZE)
