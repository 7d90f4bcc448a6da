"""Reading Hugging Face safetensors checkpoints defensively, tensor by tensor, in bounded memory.

We parse the header ourselves (8-byte length, JSON) so every offset is checked against the file
before a byte is read, and read with pread: only the bytes of the tensor asked for are touched.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from .errors import SourceError
from .format import DTYPE_ITEMSIZE, MAX_DIMENSION
from .rangeio import TensorFiles

if TYPE_CHECKING:  # pragma: no cover
    import torch

MAX_HEADER_BYTES = 100 << 20

# safetensors dtype -> FTW dtype
SAFETENSORS_DTYPES = {
    "F32": "f32",
    "F16": "f16",
    "BF16": "bf16",
    "F8_E4M3": "f8_e4m3",
    "F8_E5M2": "f8_e5m2",
    "F8_E8M0": "f8_e8m0",
    "I64": "i64",
    "I32": "i32",
    "I16": "i16",
    "I8": "i8",
    "U8": "u8",
    "BOOL": "bool",
}


@dataclass(frozen=True)
class SourceTensor:
    name: str
    file: Path
    dtype: str  # FTW dtype name
    shape: tuple[int, ...]
    offset: int  # absolute, in `file`
    nbytes: int


def read_header(path: Path) -> dict[str, SourceTensor]:
    """Parse one .safetensors file's header and check every entry against the file size."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise SourceError(f"{path}: too short to be a safetensors file ({size} bytes); re-download it")
            (header_len,) = struct.unpack("<Q", head)
            if header_len > MAX_HEADER_BYTES or 8 + header_len > size:
                raise SourceError(f"{path}: header length {header_len} is impossible for a {size}-byte file; re-download it")
            raw = f.read(header_len)
    except OSError as e:
        raise SourceError(f"{path}: cannot read ({e})") from None
    try:
        header = json.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise SourceError(f"{path}: header is not valid JSON; the file is corrupt, re-download it") from None
    if not isinstance(header, dict):
        raise SourceError(f"{path}: header is not a JSON object")
    base = 8 + header_len
    tensors: dict[str, SourceTensor] = {}
    spans: list[tuple[int, int, str]] = []
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        tensors[name] = t = _parse_entry(path, name, entry, base, size)
        spans.append((t.offset, t.offset + t.nbytes, name))
    spans.sort()
    for (_, end, a), (start, _, b) in zip(spans, spans[1:], strict=False):
        if start < end:
            raise SourceError(f"{path}: tensors {a!r} and {b!r} overlap; the file is corrupt")
    return tensors


def _parse_entry(path: Path, name: str, entry: object, base: int, size: int) -> SourceTensor:
    if not isinstance(entry, dict):
        raise SourceError(f"{path}: entry {name!r} is not an object")
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if dtype not in SAFETENSORS_DTYPES:
        raise SourceError(f"{path}: tensor {name!r} has unsupported dtype {dtype!r} (supported: {', '.join(SAFETENSORS_DTYPES)})")
    if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and 0 <= d <= MAX_DIMENSION
                                              for d in shape):
        raise SourceError(f"{path}: tensor {name!r} has a malformed shape {shape!r}")
    if (
        not isinstance(offsets, list) or len(offsets) != 2
        or not all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)
        or not 0 <= offsets[0] <= offsets[1]
    ):
        raise SourceError(f"{path}: tensor {name!r} has malformed data_offsets {offsets!r}")
    ftw_dtype = SAFETENSORS_DTYPES[dtype]
    nbytes = offsets[1] - offsets[0]
    if nbytes != DTYPE_ITEMSIZE[ftw_dtype] * math.prod(shape):
        raise SourceError(f"{path}: tensor {name!r} is {nbytes} bytes but {dtype}{shape} needs more or fewer")
    if base + offsets[1] > size:
        raise SourceError(f"{path}: tensor {name!r} extends past the end of the file; it is truncated, re-download it")
    return SourceTensor(name, path, ftw_dtype, tuple(shape), base + offsets[0], nbytes)


class SafetensorsCheckpoint(TensorFiles):
    """All tensors of a checkpoint directory (sharded with an index, or single-file)."""

    def __init__(self, directory: Path) -> None:
        super().__init__()
        self.directory = Path(directory)
        self.tensors: dict[str, SourceTensor] = {}
        for file in self._files():
            for name, t in read_header(file).items():
                if name in self.tensors:
                    raise SourceError(f"tensor {name!r} appears in both {self.tensors[name].file.name} and {file.name}")
                self.tensors[name] = t

    def _files(self) -> list[Path]:
        index = self.directory / "model.safetensors.index.json"
        if index.exists():
            try:
                weight_map = json.loads(index.read_text())["weight_map"]
                files = sorted(set(weight_map.values()))
            except (ValueError, KeyError, TypeError, AttributeError, RecursionError):
                raise SourceError(f"{index}: malformed (expected {{\"weight_map\": {{tensor: file}}}})") from None
            for name in files:
                if not isinstance(name, str) or "/" in name or name.startswith("."):
                    raise SourceError(f"{index}: refers to a file outside the checkpoint: {name!r}")
            missing = [f for f in files if not (self.directory / f).exists()]
            if missing:
                raise SourceError(f"{self.directory}: shards listed in the index are missing: {', '.join(missing)}")
            return [self.directory / f for f in files]
        files = sorted(self.directory.glob("*.safetensors"))
        if not files:
            raise SourceError(f"{self.directory}: no *.safetensors files (a Hugging Face checkpoint is expected)")
        return files

    def read(self, name: str, start_row: int = 0, num_rows: int | None = None) -> torch.Tensor:
        """Tensor `name`, or rows [start_row, start_row+num_rows) of its first dimension."""
        t = self.tensors[name]
        rows = t.shape[0] if t.shape else 1
        num_rows = rows - start_row if num_rows is None else num_rows
        row_bytes = t.nbytes // rows if rows else 0
        data = self.read_bytes(t, start_row * row_bytes, num_rows * row_bytes)
        shape = (num_rows, *t.shape[1:]) if t.shape else ()
        import torch  # (here, not at import: listing a checkpoint's tensors needs no torch)

        from .reader import TORCH_DTYPES

        return torch.from_numpy(data).view(TORCH_DTYPES[t.dtype]).view(shape)
