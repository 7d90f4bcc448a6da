"""Reading GGUF files defensively: header, metadata and tensor table, then tensor bytes by pread.

We parse the header ourselves rather than with gguf-py's GGUFReader so that every length, count
and offset is checked against the file before it is used: a truncated or corrupt file (or one
crafted to make a reader allocate or loop without end) gives a SourceError naming the file.
Nothing is executed or unpickled. Split models (`name-00001-of-00003.gguf`) are read as one.

GGUF stores dimensions fastest-first (`ne`); `GGUFTensor.shape` is the PyTorch order, reversed.
"""

from __future__ import annotations

import mmap
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .errors import SourceError
from .format import MAX_DIMENSION, align_up, nbytes_of
from .rangeio import TensorFiles

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4  # GGML_MAX_DIMS
MAX_STRING_BYTES = 64 << 20
MAX_ARRAY_ITEMS = 1 << 26
# array items in all of a file's metadata: a real vocabulary's tokens, types and merges are under
# 2M; each item becomes a Python object, so a crafted file of arrays took ~7x its size in memory
MAX_METADATA_ITEMS = 1 << 23
MAX_COUNT = 1 << 24  # tensors or metadata keys in one file
SPLIT_NAME = re.compile(r"^(?P<stem>.+)-(?P<number>\d{5})-of-(?P<count>\d{5})\.gguf$")

# GGML type id -> FTW dtype: the types ft stores (floats, ints, and block quants with a reference
# dequantizer in gguf-py). Ids from ggml.h / gguf-py's GGMLQuantizationType.
GGML_TYPES: dict[int, str] = {
    0: "f32", 1: "f16", 2: "q4_0", 3: "q4_1", 6: "q5_0", 7: "q5_1", 8: "q8_0",
    10: "q2_k", 11: "q3_k", 12: "q4_k", 13: "q5_k", 14: "q6_k",
    16: "iq2_xxs", 17: "iq2_xs", 18: "iq3_xxs", 19: "iq1_s", 20: "iq4_nl", 21: "iq3_s", 22: "iq2_s",
    23: "iq4_xs", 24: "i8", 25: "i16", 26: "i32", 27: "i64", 29: "iq1_m", 30: "bf16",
    34: "tq1_0", 35: "tq2_0", 39: "mxfp4",
}
UNSTORED_GGML_TYPES = {9: "q8_1", 15: "q8_k", 28: "f64", 40: "nvfp4", 41: "q1_0"}

# GGUF metadata value types: id -> (struct format, size) for scalars; 8 = string, 9 = array.
_SCALARS: dict[int, tuple[str, int]] = {
    0: ("<B", 1), 1: ("<b", 1), 2: ("<H", 2), 3: ("<h", 2), 4: ("<I", 4), 5: ("<i", 4),
    6: ("<f", 4), 7: ("<?", 1), 10: ("<Q", 8), 11: ("<q", 8), 12: ("<d", 8),
}
_NUMPY_SCALARS = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "<u1",
                  10: "<u8", 11: "<i8", 12: "<f8"}
_STRING, _ARRAY = 8, 9


@dataclass(frozen=True)
class GGUFTensor:
    """One tensor of a GGUF file: `nbytes` bytes at absolute `offset` in `file` (already bounds-checked)."""

    name: str
    file: Path
    ggml_type: int
    shape: tuple[int, ...]  # PyTorch order: reversed GGUF `ne`
    offset: int  # absolute, in `file`
    nbytes: int

    @property
    def dtype(self) -> str:
        """The FTW dtype; SourceError for a GGML type ft does not store."""
        dtype = GGML_TYPES.get(self.ggml_type)
        if dtype is None:
            kind = UNSTORED_GGML_TYPES.get(self.ggml_type, "unknown")
            raise SourceError(
                f"{self.file}: tensor {self.name!r} has GGML type {self.ggml_type} ({kind}), which ft cannot store; "
                f"supported: {', '.join(sorted(set(GGML_TYPES.values())))}"
            )
        return dtype


class _Cursor:
    """Bounds-checked little-endian reads from the start of a mapped file."""

    def __init__(self, buf: mmap.mmap | bytes, path: Path) -> None:
        self.buf, self.path, self.pos = buf, path, 0
        self.items_left = MAX_METADATA_ITEMS

    def need(self, n: int, what: str) -> int:
        if n < 0 or self.pos + n > len(self.buf):
            raise SourceError(
                f"{self.path}: ends inside the GGUF header ({what} at byte {self.pos} needs {n} bytes, "
                f"the file has {len(self.buf)}); it is truncated or corrupt, re-download it"
            )
        start = self.pos
        self.pos += n
        return start

    def scalar(self, kind: int, what: str) -> Any:
        fmt, size = _SCALARS[kind]
        return struct.unpack_from(fmt, self.buf, self.need(size, what))[0]

    def u32(self, what: str) -> int:
        return self.scalar(4, what)

    def u64(self, what: str) -> int:
        return self.scalar(10, what)

    def string(self, what: str) -> str:
        n = self.u64(what)
        if n > MAX_STRING_BYTES:
            raise SourceError(f"{self.path}: {what} claims {n} bytes; the file is corrupt, re-download it")
        start = self.need(n, what)
        try:
            return bytes(self.buf[start : start + n]).decode("utf-8")
        except UnicodeDecodeError:
            raise SourceError(f"{self.path}: {what} is not UTF-8; the file is corrupt, re-download it") from None

    def value(self, kind: int, what: str, depth: int = 0) -> Any:
        if kind in _SCALARS:
            return self.scalar(kind, what)
        if kind == _STRING:
            return self.string(what)
        if kind == _ARRAY and depth < 2:
            item_kind, count = self.u32(what), self.u64(what)
            if count > MAX_ARRAY_ITEMS:
                raise SourceError(f"{self.path}: {what} claims {count} items; the file is corrupt, re-download it")
            self.items_left -= count
            if self.items_left < 0:
                raise SourceError(f"{self.path}: its metadata arrays hold over {MAX_METADATA_ITEMS} items, more than "
                                  "any model's vocabulary; the file is corrupt or not a model")
            if item_kind in _NUMPY_SCALARS:
                dtype = np.dtype(_NUMPY_SCALARS[item_kind])
                start = self.need(count * dtype.itemsize, what)
                values = np.frombuffer(self.buf, dtype, int(count), start)
                return (values.astype(bool) if item_kind == 7 else values).tolist()
            return [self.value(item_kind, what, depth + 1) for _ in range(count)]
        raise SourceError(f"{self.path}: {what} has unknown value type {kind}; the file is corrupt or from a newer GGUF")


def _parse_file(path: Path) -> tuple[dict[str, Any], list[GGUFTensor]]:
    """Metadata and tensor table of one .gguf file, every tensor checked against the file size."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            buf: mmap.mmap | bytes = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if size else b""
    except OSError as e:
        raise SourceError(f"{path}: cannot read ({e})") from None
    try:
        return _parse_header(_Cursor(buf, path), size)
    finally:
        if isinstance(buf, mmap.mmap):
            buf.close()


def architecture_in_prefix(prefix: bytes, origin: str) -> str | None:
    """`general.architecture` from the first bytes of a GGUF file (read before downloading it):
    the keys are parsed in order until that one; None where the prefix ends first. SourceError
    where the bytes are not a GGUF header."""
    cur = _Cursor(prefix, Path(origin))
    if len(prefix) < 4 or prefix[:4] != GGUF_MAGIC:
        raise SourceError(f"{origin}: not a GGUF file (no GGUF magic)")
    cur.pos = 4
    try:
        if cur.u32("version") not in SUPPORTED_VERSIONS:
            return None  # the download's full parse names the problem
        cur.u64("tensor count")
        num_keys = cur.u64("metadata count")
        for _ in range(min(num_keys, MAX_COUNT)):
            key = cur.string("a metadata key")
            value = cur.value(cur.u32(f"type of {key!r}"), f"metadata {key!r}")
            if key == "general.architecture":
                return value if isinstance(value, str) else None
    except SourceError:  # the prefix ended inside the header
        return None
    return None


def _parse_header(cur: _Cursor, size: int) -> tuple[dict[str, Any], list[GGUFTensor]]:
    path = cur.path
    if size < 4 or bytes(cur.buf[:4]) != GGUF_MAGIC:
        raise SourceError(f"{path}: not a GGUF file (no GGUF magic); re-download it")
    cur.pos = 4
    version = cur.u32("version")
    if version & 0xFFFF == 0 and version:
        raise SourceError(f"{path}: a big-endian GGUF file; only little-endian GGUF is supported")
    if version not in SUPPORTED_VERSIONS:
        raise SourceError(f"{path}: GGUF version {version} is not supported (supported: {SUPPORTED_VERSIONS})")
    num_tensors, num_keys = cur.u64("tensor count"), cur.u64("metadata count")
    if num_tensors > MAX_COUNT or num_keys > MAX_COUNT:
        raise SourceError(f"{path}: claims {num_tensors} tensors and {num_keys} metadata keys; the file is corrupt")
    metadata: dict[str, Any] = {}
    for i in range(num_keys):
        key = cur.string(f"metadata key {i}")
        if key in metadata:
            raise SourceError(f"{path}: metadata key {key!r} appears twice; the file is corrupt")
        metadata[key] = cur.value(cur.u32(f"type of {key!r}"), f"metadata {key!r}")
    infos = []
    for i in range(num_tensors):
        name = cur.string(f"name of tensor {i}")
        n_dims = cur.u32(f"dimension count of {name!r}")
        if n_dims > MAX_DIMS:
            raise SourceError(f"{path}: tensor {name!r} has {n_dims} dimensions (at most {MAX_DIMS}); the file is corrupt")
        ne = [cur.u64(f"dimensions of {name!r}") for _ in range(n_dims)]
        if any(d > MAX_DIMENSION for d in ne):
            raise SourceError(f"{path}: tensor {name!r} has dimensions {ne}, beyond any model's; the file is corrupt")
        infos.append((name, ne, cur.u32(f"type of {name!r}"), cur.u64(f"offset of {name!r}")))
    alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
    if not isinstance(alignment, int) or isinstance(alignment, bool) or alignment <= 0 or alignment & (alignment - 1):
        raise SourceError(f"{path}: general.alignment {alignment!r} is not a power of two; the file is corrupt")
    data_start = align_up(cur.pos, alignment)
    tensors: list[GGUFTensor] = []
    for name, ne, ggml_type, offset in infos:
        shape = tuple(reversed(ne))
        dtype = GGML_TYPES.get(ggml_type)
        if dtype is None:  # sized from gguf-py's table only to bounds-check; refused if used
            nbytes = 0
        else:
            try:
                nbytes = nbytes_of(dtype, shape)
            except ValueError as e:
                raise SourceError(f"{path}: tensor {name!r}: {e}; the file is corrupt") from None
        if offset % alignment:
            raise SourceError(f"{path}: tensor {name!r} starts at data offset {offset}, not {alignment}-aligned; the file is corrupt")
        end = data_start + offset + nbytes
        if end > size:
            raise SourceError(
                f"{path}: tensor {name!r} ends at byte {end}, past the end of the file ({size} bytes); "
                "the file is truncated, re-download it"
            )
        tensors.append(GGUFTensor(name, path, ggml_type, shape, data_start + offset, nbytes))
    spans = sorted((t.offset, t.offset + t.nbytes, t.name) for t in tensors if t.nbytes)
    for (_, end, a), (start, _, b) in zip(spans, spans[1:], strict=False):
        if start < end:
            raise SourceError(f"{path}: tensors {a!r} and {b!r} overlap; the file is corrupt")
    return metadata, tensors


def split_files(path: Path) -> list[Path]:
    """All files of a split GGUF given any one of them (`x-00002-of-00003.gguf`), else [path]."""
    m = SPLIT_NAME.match(path.name)
    if not m:
        return [path]
    count = int(m["count"])
    files = [path.with_name(f"{m['stem']}-{i:05d}-of-{m['count']}.gguf") for i in range(1, count + 1)]
    missing = [f.name for f in files if not f.is_file()]
    if missing:
        raise SourceError(f"{path}: this split GGUF lacks {', '.join(missing)}; download every part")
    return files


class GGUFModel(TensorFiles):
    """One GGUF model (one file or all parts of a split one): metadata, tensors, and their bytes."""

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = Path(path)
        self.files = split_files(self.path)
        self.metadata: dict[str, Any] = {}
        self.tensors: dict[str, GGUFTensor] = {}
        for number, file in enumerate(self.files):
            metadata, tensors = _parse_file(file)
            if number == 0:
                self.metadata = metadata
            for t in tensors:
                if t.name in self.tensors:
                    raise SourceError(f"tensor {t.name!r} appears in both {self.tensors[t.name].file.name} and {file.name}")
                self.tensors[t.name] = t
        declared = self.metadata.get("split.count", 1)
        if declared != len(self.files):
            raise SourceError(
                f"{self.path}: split.count says {declared} parts, the file names say {len(self.files)}; "
                "keep the parts' original names (NAME-00001-of-0000N.gguf) side by side"
            )
