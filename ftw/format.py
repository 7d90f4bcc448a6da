"""The FTW index: constants, dtypes, and the typed, validated view of `model.ftw.json`.

The full specification is docs/FTW.md. This module is the single place that turns index JSON
into objects and back; the writer produces these objects and the reader validates them against
the shards before anything is read.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from typing import Any

from .errors import CorruptIndexError, UnsupportedVersionError

FORMAT_NAME = "ftw"
FORMAT_VERSION = 1
SUPPORTED_VERSIONS = frozenset({1})
ALIGNMENT = 4096  # every tensor, bank and expert record starts on this boundary
PART_ALIGNMENT = 256  # parts inside one expert record
INDEX_FILENAME = "model.ftw.json"
MAX_INDEX_BYTES = 256 << 20
# no tensor of any model has a dimension near this; a header's [0, 2**63] holds no bytes, and
# passed every size check until torch was asked for it
MAX_DIMENSION = 1 << 40

# FTW dtype name -> bytes per element.
DTYPE_ITEMSIZE: dict[str, int] = {
    "f32": 4,
    "f16": 2,
    "bf16": 2,
    "f8_e4m3": 1,
    "f8_e5m2": 1,
    "f8_e8m0": 1,  # (a power of two a byte: DeepSeek-V4's block scales, made f32 at conversion)
    "i64": 8,
    "i32": 4,
    "i16": 2,
    "i8": 1,
    "u8": 1,
    "bool": 1,
}


# GGML block-quantized dtypes, kept byte for byte as GGUF stores them (docs/FTW.md, "Block-quantized
# tensors"): name -> (elements per block, bytes per block), as in gguf-py's GGML_QUANT_SIZES. A
# tensor's shape is its logical element shape; each row (last dimension) is a whole number of
# blocks, quantized independently of the other rows. Only types with a reference dequantizer in
# gguf-py are listed (tests check the numbers against it).
BLOCK_DTYPES: dict[str, tuple[int, int]] = {
    "q4_0": (32, 18),
    "q4_1": (32, 20),
    "q5_0": (32, 22),
    "q5_1": (32, 24),
    "q8_0": (32, 34),
    "q2_k": (256, 84),
    "q3_k": (256, 110),
    "q4_k": (256, 144),
    "q5_k": (256, 176),
    "q6_k": (256, 210),
    "iq2_xxs": (256, 66),
    "iq2_xs": (256, 74),
    "iq2_s": (256, 82),
    "iq3_xxs": (256, 98),
    "iq3_s": (256, 110),
    "iq1_s": (256, 50),
    "iq1_m": (256, 56),
    "iq4_nl": (32, 18),
    "iq4_xs": (256, 136),
    "tq1_0": (256, 54),
    "tq2_0": (256, 66),
    "mxfp4": (32, 17),
}
KNOWN_DTYPES = frozenset(DTYPE_ITEMSIZE) | frozenset(BLOCK_DTYPES)


def shard_filename(number: int) -> str:
    return f"model-{number:05d}.ftw"


def align_up(value: int, alignment: int = ALIGNMENT) -> int:
    return (value + alignment - 1) // alignment * alignment


def nbytes_of(dtype: str, shape: tuple[int, ...]) -> int:
    """Bytes of a C-contiguous `dtype` tensor of logical `shape`.

    ValueError when a block-quantized shape's rows are not a whole number of blocks."""
    if dtype in BLOCK_DTYPES:
        return math.prod(storage_shape(dtype, shape))
    return DTYPE_ITEMSIZE[dtype] * math.prod(shape)


def storage_shape(dtype: str, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The shape the reader returns: `shape` itself, or for a block-quantized dtype the raw
    bytes as uint8 `[*shape[:-1], row_bytes]` (what `gguf.quants.dequantize` takes)."""
    if dtype not in BLOCK_DTYPES:
        return tuple(shape)
    block_size, type_size = BLOCK_DTYPES[dtype]
    if not shape or shape[-1] % block_size:
        raise ValueError(f"{dtype} needs a last dimension that is a multiple of {block_size}, got {list(shape)}")
    return (*shape[:-1], shape[-1] // block_size * type_size)


@dataclass(frozen=True)
class TensorEntry:
    """One dense tensor: `nbytes` bytes at `offset` in `shard`."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    shard: str
    offset: int
    nbytes: int


@dataclass(frozen=True)
class ExpertPart:
    """One piece of an expert record (e.g. `w13`, the fused gate+up projection)."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    offset: int  # from the start of the expert record
    nbytes: int


# How an expert's gate and up projections combine (ExpertActivation.kind): SiLU-gated, as every
# family but gpt-oss and DeepSeek-V4; gpt-oss's clamped variant (transformers' GptOssExperts._apply_gate);
# DeepSeek-V4's SwiGLU of clamped inputs (DeepseekV4Experts._apply_gate); Gemma 4's GELU-gated
# experts (gelu_pytorch_tanh, Gemma4TextExperts); Nemotron-H's experts, not gated: relu(up)^2
# (NemotronHExperts, mlp_hidden_act relu2), whose records hold only the up rows in w13; Doge's
# retrieval experts, not gated either: silu(up) (DogeCDMoE, one row each: down_embed)
ACTIVATION_KINDS = ("swiglu", "swiglu_clamped", "swiglu_limited", "geglu_tanh", "relu2", "silu")
CLAMPED_KINDS = ("swiglu_clamped", "swiglu_limited")  # the kinds that need a `limit`
UNGATED_KINDS = ("relu2", "silu")  # one projection before down: w13 is [I, H] (up), w13_bias [I]


@dataclass(frozen=True)
class ExpertActivation:
    """The function between an expert's two projections, h = act(gate, up), of gate = w13's first
    I rows times x (plus `w13_bias`'s first I values where the record has biases), up the rest.

    "swiglu": silu(gate) * up. "swiglu_clamped" (gpt-oss): gate clamped above at `limit`, up to
    [-limit, limit], then gate * sigmoid(alpha * gate) * (up + 1). "swiglu_limited" (DeepSeek-V4's
    `swiglu_limit`): the same clamps, then silu(gate) * up. "geglu_tanh" (Gemma 4): gelu(gate) * up,
    GELU's tanh approximation. "relu2" (Nemotron-H): not gated, relu(up)^2, w13 holding the up
    rows alone (I of them, `gated` false); "silu" (Doge) likewise not gated: silu(up). A bank
    without an `activation` in its index has plain SwiGLU."""

    kind: str = "swiglu"
    alpha: float = 1.0
    limit: float | None = None

    @property
    def gated(self) -> bool:
        """Whether w13 holds gate rows before the up rows (2I), or the up rows alone (I)."""
        return self.kind not in UNGATED_KINDS

    def w13_rows(self, inter: int) -> int:
        """The rows of w13 (and values of w13_bias) for experts `inter` wide."""
        return 2 * inter if self.gated else inter


SWIGLU = ExpertActivation()


@dataclass(frozen=True)
class ExpertBank:
    """All experts of one MoE layer: `num_experts` records of `expert_stride` bytes each.

    Expert `e` of this layer is the byte range
    `[offset + e * expert_stride, offset + e * expert_stride + record_bytes)` of `shard`.
    Each record may carry `w13_bias` [2I] and `w2_bias` [H] parts beside its weights (gpt-oss);
    w13 is [2I, H], or [I, H] where `activation` is not gated (`ExpertActivation.w13_rows`).
    """

    layer: int
    num_experts: int
    expert_stride: int
    shard: str
    offset: int
    parts: tuple[ExpertPart, ...]
    quant: dict[str, Any] = field(default_factory=dict)  # e.g. {"fp8_block": [128, 128]}
    activation: ExpertActivation = SWIGLU

    @property
    def nbytes(self) -> int:
        return self.num_experts * self.expert_stride

    @property
    def record_bytes(self) -> int:
        return max(p.offset + p.nbytes for p in self.parts)

    def part(self, name: str) -> ExpertPart:
        for p in self.parts:
            if p.name == name:
                return p
        raise KeyError(f"expert bank of layer {self.layer} has no part {name!r}")


@dataclass(frozen=True)
class ShardEntry:
    name: str
    size: int
    sha256: str


@dataclass(frozen=True)
class Index:
    """The parsed, validated content of `model.ftw.json`."""

    family: str
    config: dict[str, Any]  # normalized: see docs/FTW.md "config"
    source_config: dict[str, Any]  # the checkpoint's config.json, as shipped
    tensors: tuple[TensorEntry, ...]
    banks: tuple[ExpertBank, ...]
    shards: tuple[ShardEntry, ...]
    metadata: dict[str, Any] = field(default_factory=dict)
    version: int = FORMAT_VERSION

    def tensor(self, name: str) -> TensorEntry:
        for t in self.tensors:
            if t.name == name:
                return t
        raise KeyError(f"FTW index has no tensor {name!r}")

    def bank(self, layer: int) -> ExpertBank:
        for b in self.banks:
            if b.layer == layer:
                return b
        raise KeyError(f"FTW index has no expert bank for layer {layer}")

    def shard(self, name: str) -> ShardEntry:
        for s in self.shards:
            if s.name == name:
                return s
        raise KeyError(f"FTW index has no shard {name!r}")

    def to_json(self) -> str:
        doc = {
            "format": FORMAT_NAME,
            "version": self.version,
            "family": self.family,
            "config": self.config,
            "source_config": self.source_config,
            "metadata": self.metadata,
            "shards": [asdict(s) for s in self.shards],
            "tensors": [asdict(t) for t in self.tensors],
            "banks": [_bank_json(b) for b in self.banks],
        }
        return json.dumps(doc, indent=1, sort_keys=False) + "\n"

    @staticmethod
    def from_json(text: str | bytes, *, origin: str = "model.ftw.json") -> Index:
        """Parse and structurally validate index JSON; shard contents are checked by the reader."""
        if len(text) > MAX_INDEX_BYTES:
            raise CorruptIndexError(f"{origin}: index is {len(text)} bytes, over the {MAX_INDEX_BYTES} limit")
        try:
            doc = json.loads(text)
        except (ValueError, UnicodeDecodeError, RecursionError) as e:
            raise CorruptIndexError(f"{origin}: not valid JSON ({e}); re-pull the model") from None
        return _IndexParser(origin).parse(doc)


def _bank_json(bank: ExpertBank) -> dict[str, Any]:
    """A bank's JSON; `activation` only where it is not plain SwiGLU (indexes written before
    it existed stay as they were)."""
    doc = asdict(bank)
    if bank.activation == SWIGLU:
        del doc["activation"]
    return doc


class _IndexParser:
    """Defensive JSON -> Index conversion: every field is type- and range-checked."""

    def __init__(self, origin: str) -> None:
        self.origin = origin

    def fail(self, message: str) -> CorruptIndexError:
        return CorruptIndexError(f"{self.origin}: {message}; the file is damaged or not FTW (re-pull the model)")

    def get(self, obj: Any, key: str, kind: type | tuple[type, ...], where: str) -> Any:
        if not isinstance(obj, dict) or key not in obj:
            raise self.fail(f"{where} lacks {key!r}")
        value = obj[key]
        if isinstance(value, bool) and kind is int:
            raise self.fail(f"{where}.{key} must be an integer")
        if not isinstance(value, kind):
            raise self.fail(f"{where}.{key} has the wrong type ({type(value).__name__})")
        return value

    def uint(self, obj: Any, key: str, where: str) -> int:
        value = self.get(obj, key, int, where)
        if value < 0:
            raise self.fail(f"{where}.{key} is negative")
        return value

    def shape(self, obj: Any, where: str) -> tuple[int, ...]:
        raw = self.get(obj, "shape", list, where)
        if len(raw) > 8 or not all(isinstance(d, int) and not isinstance(d, bool) and 0 <= d <= MAX_DIMENSION
                                   for d in raw):
            raise self.fail(f"{where}.shape is not a list of non-negative integers up to {MAX_DIMENSION}")
        return tuple(raw)

    def dtype(self, obj: Any, where: str) -> str:
        value = self.get(obj, "dtype", str, where)
        if value not in KNOWN_DTYPES:
            raise self.fail(
                f"{where}.dtype {value!r} is unknown (known: {', '.join([*DTYPE_ITEMSIZE, *BLOCK_DTYPES])})"
            )
        if value in BLOCK_DTYPES:
            try:
                storage_shape(value, self.shape(obj, where))
            except ValueError as e:
                raise self.fail(f"{where}: {e}") from None
        return value

    def parse(self, doc: Any) -> Index:
        if not isinstance(doc, dict) or doc.get("format") != FORMAT_NAME:
            raise self.fail("not an FTW index (missing \"format\": \"ftw\")")
        version = self.get(doc, "version", int, "index")
        if version not in SUPPORTED_VERSIONS:
            raise UnsupportedVersionError(
                f"{self.origin}: FTW version {version} is not supported by this ft "
                f"(supported: {sorted(SUPPORTED_VERSIONS)}); upgrade ft or re-pull the model"
            )
        shards = tuple(self.parse_shard(s, f"shards[{i}]") for i, s in enumerate(self.get(doc, "shards", list, "index")))
        tensors = tuple(self.parse_tensor(t, f"tensors[{i}]") for i, t in enumerate(self.get(doc, "tensors", list, "index")))
        banks = tuple(self.parse_bank(b, f"banks[{i}]") for i, b in enumerate(self.get(doc, "banks", list, "index")))
        return Index(
            family=self.get(doc, "family", str, "index"),
            config=self.get(doc, "config", dict, "index"),
            source_config=self.get(doc, "source_config", dict, "index"),
            metadata=self.get(doc, "metadata", dict, "index"),
            tensors=tensors,
            banks=banks,
            shards=shards,
            version=version,
        )

    def parse_shard(self, raw: Any, where: str) -> ShardEntry:
        name = self.get(raw, "name", str, where)
        if "/" in name or "\\" in name or name.startswith(".") or not name:
            raise self.fail(f"{where}.name {name!r} is not a plain file name")
        sha = self.get(raw, "sha256", str, where)
        if len(sha) != 64 or any(c not in "0123456789abcdef" for c in sha):
            raise self.fail(f"{where}.sha256 is not 64 lowercase hex digits")
        return ShardEntry(name=name, size=self.uint(raw, "size", where), sha256=sha)

    def parse_tensor(self, raw: Any, where: str) -> TensorEntry:
        return TensorEntry(
            name=self.get(raw, "name", str, where),
            dtype=self.dtype(raw, where),
            shape=self.shape(raw, where),
            shard=self.get(raw, "shard", str, where),
            offset=self.uint(raw, "offset", where),
            nbytes=self.uint(raw, "nbytes", where),
        )

    def parse_bank(self, raw: Any, where: str) -> ExpertBank:
        parts = tuple(
            ExpertPart(
                name=self.get(p, "name", str, f"{where}.parts[{j}]"),
                dtype=self.dtype(p, f"{where}.parts[{j}]"),
                shape=self.shape(p, f"{where}.parts[{j}]"),
                offset=self.uint(p, "offset", f"{where}.parts[{j}]"),
                nbytes=self.uint(p, "nbytes", f"{where}.parts[{j}]"),
            )
            for j, p in enumerate(self.get(raw, "parts", list, where))
        )
        if not parts:
            raise self.fail(f"{where} has no parts")
        return ExpertBank(
            layer=self.uint(raw, "layer", where),
            num_experts=self.uint(raw, "num_experts", where),
            expert_stride=self.uint(raw, "expert_stride", where),
            shard=self.get(raw, "shard", str, where),
            offset=self.uint(raw, "offset", where),
            parts=parts,
            quant=self.get(raw, "quant", dict, where) if "quant" in raw else {},
            activation=self.parse_activation(raw["activation"], f"{where}.activation") if "activation" in raw else SWIGLU,
        )

    def parse_activation(self, raw: Any, where: str) -> ExpertActivation:
        kind = self.get(raw, "kind", str, where)
        if kind not in ACTIVATION_KINDS:
            raise self.fail(f"{where}.kind {kind!r} is unknown (this ft knows {', '.join(ACTIVATION_KINDS)})")
        alpha, limit = raw.get("alpha", 1.0), raw.get("limit")
        if kind in CLAMPED_KINDS and limit is None:
            raise self.fail(f"{where} is a clamped SwiGLU without its limit")
        for key, value in (("alpha", alpha), ("limit", 1.0 if limit is None else limit)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
                raise self.fail(f"{where}.{key} is {str(value)[:20]}, not a finite number above 0")
        return ExpertActivation(kind=kind, alpha=float(alpha), limit=None if limit is None else float(limit))
