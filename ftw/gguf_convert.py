"""GGUF -> FTW, streaming, in bounded memory, block quants kept byte for byte.

The FTW layout is the one the safetensors converter writes: dense tensors under Hugging Face
names, each MoE layer's routed experts as one bank of expert records. A record's `w13` is the
expert's gate rows then its up rows, both GGML-quantized row blocks copied as stored (each row is
quantized on its own, so concatenating rows is valid); `w2` is its down projection. When gate and
up have different GGML types (some mixed quantizations), the record has `w1` and `w3` instead of
`w13`. The tokenizer files are written beside the index (GGUF_SIDE_FILES). Old Mixtral files
(llama, before April 2024) store each expert as its own blk.N.ffn_{gate,up,down}.E.weight; a layer's
are read as the fused [E, ...] tensor they stand for (_StackedExperts), their bytes as stored.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .check_tensors import FamilyCheck, check_source_tensors
from .errors import SourceError
from .families import check_dense_shape, family_for_config, index_in_name, normalized_config
from .format import BLOCK_DTYPES, Index, storage_shape
from .gguf_file import GGUFModel, GGUFTensor
from .gguf_names import DROPPED_BLOCK, DROPPED_GLOBAL, EXPERT_BIAS_ROWS, EXPERT_ROWS
from .gguf_source import GGUFArchitecture, architecture_for
from .gguf_tokenizer import gguf_tokenizer_config, gguf_tokenizer_json
from .gguf_undo import (
    CONCAT_ROWS,
    KV_B_HF,
    KV_B_SPLIT,
    ROW_VECTORS,
    WIDENED,
    Undo,
    hf_rows_of_llama_qk,
    undo_for,
)
from .rangeio import readahead
from .reader import TORCH_DTYPES
from .writer import DEFAULT_MAX_SHARD_BYTES, FTWWriter

GGUF_SIDE_FILES = ("tokenizer.json", "tokenizer_config.json")
# old Mixtral GGUFs (llama.cpp before its April 2024 fusion): each expert its own blk.N.ffn_gate.E.weight
PER_EXPERT_NAME = re.compile(r"^ffn_(gate|up|down)\.(\d+)\.weight$")
READAHEAD_BYTES = 256 << 20
READ_THREADS = 4
FLOAT_DTYPES = ("f32", "f16", "bf16")
INT_DTYPES = {"i8": np.dtype("<i1"), "i16": np.dtype("<i2"), "i32": np.dtype("<i4"), "i64": np.dtype("<i8")}
Progress = Callable[[int], None]
Chunks = Callable[[], Iterable[np.ndarray]]


@dataclass
class _Dense:
    name: str  # Hugging Face name
    dtype: str
    shape: tuple[int, ...]
    chunks: Chunks


@dataclass(frozen=True)
class _StackedExperts:
    """One layer's per-expert tensors of one role (the old Mixtral layout) standing for the fused
    ffn_<role>_exps [E, rows, cols]: expert e's bytes are parts[e]'s, whole GGML rows as stored."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int
    parts: tuple[GGUFTensor, ...]


def _stacked(path: Path, layer: int, role: str, by_expert: dict[int, GGUFTensor]) -> _StackedExperts:
    if sorted(by_expert) != list(range(len(by_expert))):
        raise SourceError(f"{path}: layer {layer} has per-expert ffn_{role} tensors for experts {sorted(by_expert)}, "
                          "not 0 to E-1")
    parts = tuple(by_expert[e] for e in range(len(by_expert)))
    first = parts[0]
    for t in parts:
        if len(t.shape) != 2 or t.shape != first.shape or t.dtype != first.dtype or t.nbytes != first.nbytes:
            raise SourceError(f"{path}: {t.name} is {t.dtype} {list(t.shape)}, {first.name} {first.dtype} "
                              f"{list(first.shape)}; a layer's experts must agree in type and shape")
    return _StackedExperts(f"blk.{layer}.ffn_{role}.{{0..{len(parts) - 1}}}.weight", first.dtype,
                           (len(parts), *first.shape), first.nbytes * len(parts), parts)


def _split_block_name(name: str) -> tuple[int, str] | None:
    parts = name.split(".", 2)
    if len(parts) == 3 and parts[0] == "blk":
        return index_in_name(parts[1], name), parts[2]
    return None


class _GGUFConverter:
    def __init__(self, path: Path, out: Path, max_shard_bytes: int, progress: Progress | None, tokenizer: bool,
                 family_check: FamilyCheck | None = None) -> None:
        self.family_check = family_check
        self.model = GGUFModel(path)
        try:
            self.arch: GGUFArchitecture = architecture_for(self.model)
            self.source_config = self.arch.hf_config(self.model)
            self.family = family_for_config(self.source_config)
            self.config = normalized_config(self.family, self.source_config)
            # built before any weight is written, so an unsupported tokenizer fails fast
            self.side_files = self._tokenizer_files() if tokenizer else {}
        except BaseException:
            self.model.close()
            raise
        self.out = Path(out)
        self.progress = progress or (lambda n: None)
        self.writer = FTWWriter(self.out, max_shard_bytes=max_shard_bytes)
        self.params_by_dtype: dict[str, int] = defaultdict(int)

    def _tokenizer_files(self) -> dict[str, dict[str, Any]]:
        context = self.config["context_length"] or None
        return {"tokenizer.json": gguf_tokenizer_json(self.model),
                "tokenizer_config.json": gguf_tokenizer_config(self.model, context_length=context)}

    # -- classification -------------------------------------------------------------------------

    def classify(self) -> tuple[dict[int, list[_Dense]], dict[int, dict[str, GGUFTensor | _StackedExperts]], int]:
        """Dense tensors by layer (-1 before the layers, num_layers after), expert tensors by layer."""
        num_layers = self.config["num_layers"]
        names = self.arch.tensor_names(num_layers, self.source_config.get("layer_types"))
        dense: dict[int, list[_Dense]] = defaultdict(list)
        experts: dict[int, dict[str, GGUFTensor | _StackedExperts]] = defaultdict(dict)
        per_expert: dict[int, dict[str, dict[int, GGUFTensor]]] = defaultdict(lambda: defaultdict(dict))
        kv_b: dict[int, dict[str, GGUFTensor]] = defaultdict(dict)
        concat_parts = self.arch.concat_parts()
        concats: dict[tuple[int, str], dict[int, GGUFTensor]] = defaultdict(dict)
        dropped = 0
        for name, t in self.model.tensors.items():
            block = _split_block_name(name)
            if name in names:
                layer = block[0] if block else (-1 if name.startswith("token_embd") else num_layers)
                dense[layer].append(self._dense(names[name], t, block[1] if block else name))
            elif (block and block[0] >= num_layers) or name in DROPPED_GLOBAL or (block and block[1] in DROPPED_BLOCK):
                dropped += 1  # multi-token-prediction blocks, llama.cpp-only tables
            elif block and block[1] in concat_parts:
                hf, place = concat_parts[block[1]]
                concats[(block[0], hf)][place] = t
            elif block and block[1] in EXPERT_ROWS:
                experts[block[0]][EXPERT_ROWS[block[1]]] = t
            elif block and block[1] in EXPERT_BIAS_ROWS:
                experts[block[0]][EXPERT_BIAS_ROWS[block[1]]] = t
            elif block and block[1] in KV_B_SPLIT:
                kv_b[block[0]][KV_B_SPLIT[block[1]]] = t
            elif block and (m := PER_EXPERT_NAME.match(block[1])) and self.arch.name == "llama":
                per_expert[block[0]][m[1]][index_in_name(m[2], name)] = t
            elif block and PER_EXPERT_NAME.match(block[1]):
                raise SourceError(f"{self.model.path}: {name!r} is in the old per-expert GGUF layout, which ft "
                                  "reads only for llama (Mixtral); download a GGUF made by a recent llama.cpp")
            else:
                raise SourceError(
                    f"{self.model.path}: tensor {name!r} has no Hugging Face name in ft's {self.arch.name} table "
                    "(ftw/gguf_names.py, gguf_names_own.py); this GGUF variant is not supported"
                )
        for layer, roles in per_expert.items():
            for role, by_expert in roles.items():
                if role in experts[layer]:
                    raise SourceError(f"{self.model.path}: layer {layer} has both ffn_{role}_exps and per-expert "
                                      f"ffn_{role}.E tensors")
                experts[layer][role] = _stacked(self.model.path, layer, role, by_expert)
        for layer, halves in kv_b.items():
            hf = self.arch.hf_layer_prefix.format(layer=layer) + KV_B_HF
            if any(d.name == hf for d in dense[layer]):
                raise SourceError(f"{self.model.path}: layer {layer} has both attn_kv_b and attn_k_b/attn_v_b")
            dense[layer].append(self._kv_b(layer, hf, halves))
        for (layer, hf), parts in concats.items():
            dense[layer].append(self._row_concat(self.arch.hf_layer_prefix.format(layer=layer) + hf, parts))
        for d in (d for layer_dense in dense.values() for d in layer_dense):
            try:
                check_dense_shape(d.name, d.shape, self.config)
            except SourceError as e:
                raise SourceError(f"{self.model.path}: {e}") from None
        expected = self.config["moe_layers"]
        if sorted(experts) != expected:
            raise SourceError(
                f"{self.model.path}: routed experts in layers {sorted(experts)}, the metadata implies {expected}; "
                "the file is incomplete or not a model ft knows"
            )
        return dense, experts, dropped

    def _dense(self, hf_name: str, t: GGUFTensor, gguf_name: str) -> _Dense:
        if self.arch.permute_qk and gguf_name in ("attn_q.weight", "attn_q.bias", "attn_k.weight", "attn_k.bias"):
            heads = self.config["num_attention_heads" if gguf_name.startswith("attn_q") else "num_key_value_heads"]
            if len(t.shape) not in (1, 2):
                raise SourceError(f"{self.model.path}: {gguf_name} has shape {list(t.shape)}; a query or key "
                                  "projection is a matrix or a bias")
            order = hf_rows_of_llama_qk(t.shape[0], heads)

            def unpermuted() -> list[np.ndarray]:
                data = self.model.read_bytes(t)
                self.progress(data.nbytes)
                return [np.ascontiguousarray(data.reshape(t.shape[0], -1)[order]).reshape(-1)]

            return _Dense(hf_name, t.dtype, t.shape, unpermuted)
        widened = WIDENED.get(gguf_name)
        if widened is not None and self.arch.name in widened[0]:
            return self._widened(hf_name, t, widened[1])
        undo = undo_for(gguf_name, self.arch.name)
        if undo is not None:
            return self._undone(hf_name, t, undo)
        flat = len(t.shape) == 1 and self.arch.name in ROW_VECTORS.get(gguf_name, ())
        shape = (1, *t.shape) if flat else t.shape  # the same bytes
        return _Dense(hf_name, t.dtype, shape, lambda: self._chunks(t))

    def _undone(self, hf_name: str, t: GGUFTensor, undo: Undo) -> _Dense:
        """A tensor llama.cpp changed in value (gguf_undo.UNDONE), changed back, in float32."""
        if t.dtype not in FLOAT_DTYPES:
            raise SourceError(f"{self.model.path}: {t.name} is {t.dtype}; llama.cpp writes it as floats, and ft "
                              "reads it only so")

        def values() -> list[np.ndarray]:
            with np.errstate(invalid="raise", divide="raise"):
                try:
                    out = undo.inverse(self._as_float(t, "f32").numpy())
                except FloatingPointError:
                    raise SourceError(f"{self.model.path}: {t.name} holds values llama.cpp's converter cannot have "
                                      "written (e.g. a decay that is not negative); the file is damaged") from None
            return [np.ascontiguousarray(out, dtype=np.float32).reshape(-1).view(np.uint8)]

        return _Dense(hf_name, "f32", undo.hf_shape(tuple(t.shape)), values)

    def _widened(self, hf_name: str, t: GGUFTensor, dtype: str) -> _Dense:
        """An integer tensor the converter narrowed (gguf_undo.WIDENED), back in the HF checkpoint's `dtype`."""
        if t.dtype not in INT_DTYPES:
            raise SourceError(f"{self.model.path}: {t.name} is {t.dtype}; llama.cpp writes it as integers")

        def values() -> list[np.ndarray]:
            data = self.model.read_bytes(t)
            self.progress(data.nbytes)
            ints = data.view(INT_DTYPES[t.dtype])
            return [ints.astype(INT_DTYPES[dtype]).view(np.uint8).reshape(-1)]

        return _Dense(hf_name, dtype, t.shape, values)

    def _chunks(self, t: GGUFTensor) -> Iterator[np.ndarray]:
        for chunk in self.model.iter_chunks(t):
            yield chunk
            self.progress(chunk.nbytes)

    def _row_concat(self, hf_name: str, parts: dict[int, GGUFTensor]) -> _Dense:
        """An HF tensor llama.cpp split by rows (CONCAT_ROWS), joined back. GGML quantizes each row on
        its own, so parts of one type join as stored; parts of different types (a mixed quantization)
        are dequantized (gguf-py's reference) and joined in float32."""
        want = next(len(c.parts) for c in CONCAT_ROWS if hf_name.endswith("." + c.hf))
        if sorted(parts) != list(range(want)):
            raise SourceError(f"{self.model.path}: {hf_name} needs {want} parts, the file has {len(parts)} of them")
        ts = [parts[i] for i in range(want)]
        if any(len(t.shape) != 2 or t.shape[1] != ts[0].shape[1] for t in ts):
            raise SourceError(f"{self.model.path}: the parts of {hf_name} have shapes {[list(t.shape) for t in ts]}, "
                              "not matrices of one width")
        shape = (sum(t.shape[0] for t in ts), ts[0].shape[1])
        if all(t.dtype == ts[0].dtype for t in ts):
            return _Dense(hf_name, ts[0].dtype, shape, lambda: (c for t in ts for c in self._chunks(t)))

        def joined() -> list[np.ndarray]:
            rows = torch.cat([self._as_float(t, "f32").reshape(t.shape) for t in ts])  # [sum of rows, width]
            return [rows.contiguous().view(torch.uint8).numpy().reshape(-1)]

        return _Dense(hf_name, "f32", shape, joined)

    def _kv_b(self, layer: int, hf_name: str, halves: dict[str, GGUFTensor]) -> _Dense:
        """DeepSeek MLA's kv_b_proj [heads * (nope + v), kv_lora_rank] from llama.cpp's split halves.

        Float halves are transposed exactly in their dtype; block-quantized ones cannot be
        transposed as bytes, so they are dequantized (gguf-py's reference) and kv_b is float32."""
        if set(halves) != {"k_b", "v_b"}:
            raise SourceError(f"{self.model.path}: layer {layer} has {sorted(halves)} of attn_k_b/attn_v_b, needs both")
        c = self.source_config
        heads, nope, v_dim, rank = c["num_attention_heads"], c["qk_nope_head_dim"], c["v_head_dim"], c["kv_lora_rank"]
        k_t, v_t = halves["k_b"], halves["v_b"]
        for t, shape in ((k_t, (heads, rank, nope)), (v_t, (heads, v_dim, rank))):
            if math.prod(t.shape) != math.prod(shape) or t.shape[-1] != shape[-1]:
                raise SourceError(f"{self.model.path}: {t.name} has shape {list(t.shape)}, expected {list(shape)}")
        same_float = k_t.dtype == v_t.dtype and k_t.dtype in FLOAT_DTYPES
        dtype = k_t.dtype if same_float else "f32"

        def build() -> list[np.ndarray]:
            k = self._as_float(k_t, dtype).reshape(heads, rank, nope).transpose(1, 2)  # [heads, nope, rank]
            v = self._as_float(v_t, dtype).reshape(heads, v_dim, rank)
            kv = torch.cat([k, v], dim=1).reshape(heads * (nope + v_dim), rank).contiguous()
            return [kv.view(torch.uint8).numpy().reshape(-1)]

        return _Dense(hf_name, dtype, (heads * (nope + v_dim), rank), build)

    def _as_float(self, t: GGUFTensor, dtype: str) -> torch.Tensor:
        data = self.model.read_bytes(t)
        self.progress(data.nbytes)
        if t.dtype in BLOCK_DTYPES:
            from gguf.constants import GGMLQuantizationType
            from gguf.quants import dequantize

            values = dequantize(data.reshape(storage_shape(t.dtype, t.shape)), GGMLQuantizationType(t.ggml_type))
            return torch.from_numpy(np.ascontiguousarray(values, dtype=np.float32))
        if t.dtype not in FLOAT_DTYPES:
            raise SourceError(f"{self.model.path}: {t.name} has dtype {t.dtype}, expected a float or block-quantized type")
        return torch.from_numpy(data).view(TORCH_DTYPES[t.dtype]).to(TORCH_DTYPES[dtype])

    # -- writing --------------------------------------------------------------------------------

    def write_dense(self, d: _Dense) -> int:
        self.writer.add_tensor(d.name, d.dtype, d.shape, d.chunks())
        self.params_by_dtype[d.dtype] += math.prod(d.shape)
        return math.prod(d.shape)

    def write_bank(self, layer: int, src: dict[str, GGUFTensor | _StackedExperts]) -> int:
        """Write one layer's experts; returns the parameter count of one expert."""
        cfg = self.config
        num_experts, inter, hidden = cfg["num_experts"], cfg["moe_intermediate_size"], cfg["hidden_size"]

        def need(role: str, rows: int, cols: int) -> GGUFTensor | _StackedExperts:
            t = src.get(role)
            if t is None:
                raise SourceError(f"{self.model.path}: layer {layer} lacks ffn_{role}_exps")
            if t.shape != (num_experts, rows, cols):
                raise SourceError(f"{self.model.path}: {t.name} has shape {list(t.shape)}, "
                                  f"expected [{num_experts}, {rows}, {cols}]")
            return t

        down = need("down", hidden, inter)
        activation = self.family.expert_activation(self.family.text_config(self.source_config))
        if not activation.gated:  # (Nemotron-H's relu2: ffn_up_exps alone, w13 its up rows)
            sources = {"w13": [need("up", inter, hidden)], "w2": [down]}
        elif "gate_up" in src:
            gate_up = need("gate_up", 2 * inter, hidden)
            sources = {"w13": [gate_up], "w2": [down]}
        else:
            gate, up = need("gate", inter, hidden), need("up", inter, hidden)
            sources = {"w13": [gate, up], "w2": [down]} if gate.dtype == up.dtype else {"w1": [gate], "w3": [up], "w2": [down]}
        shapes = {"w13": (activation.w13_rows(inter), hidden), "w1": (inter, hidden), "w3": (inter, hidden), "w2": (hidden, inter)}
        parts = [(name, ts[0].dtype, shapes[name]) for name, ts in sources.items()]
        for _, dtype, shape in parts:
            self.params_by_dtype[dtype] += num_experts * math.prod(shape)
        parts += self._bias_parts(layer, src, sources, inter, hidden)

        def one(t: GGUFTensor | _StackedExperts, e: int) -> np.ndarray:
            if isinstance(t, _StackedExperts):
                return self.model.read_bytes(t.parts[e])
            return self.model.read_bytes(t, e * (t.nbytes // num_experts), t.nbytes // num_experts)

        def read(e: int) -> dict[str, list[np.ndarray]]:
            return {name: [one(t, e) for t in ts] for name, ts in sources.items()}

        expert_bytes = sum(t.nbytes for ts in sources.values() for t in ts) // num_experts
        depth = max(2, READAHEAD_BYTES // max(1, expert_bytes))
        with self.writer.expert_bank(layer, num_experts, parts, activation=activation) as bank:
            for e, pieces in enumerate(readahead(self.pool, read, num_experts, depth)):
                bank.write_expert(e, pieces)
                self.progress(sum(b.nbytes for bufs in pieces.values() for b in bufs))
        return (activation.w13_rows(inter) + inter) * hidden

    def _bias_parts(self, layer: int, src: dict[str, GGUFTensor | _StackedExperts],
                    sources: dict[str, list[GGUFTensor | _StackedExperts]], inter: int,
                    hidden: int) -> list[tuple[str, str, tuple[int, ...]]]:
        """The experts' biases (gpt-oss: ffn_{gate,up,down}_exps.bias, all three or none) as the record's
        w13_bias [2I] (gate's, then up's) and w2_bias [H], added to `sources`; their parts."""
        given = [role for role in ("gate_bias", "up_bias", "down_bias") if role in src]
        if not given:
            return []
        num_experts = self.config["num_experts"]
        expected = {"gate_bias": (num_experts, inter), "up_bias": (num_experts, inter), "down_bias": (num_experts, hidden)}
        for role, shape in expected.items():
            t = src.get(role)
            if t is None:
                raise SourceError(f"{self.model.path}: layer {layer} has expert biases {given} but not ffn_{role[:-5]}"
                                  "_exps.bias; a file ft can read has all three or none")
            if t.shape != shape or t.dtype not in FLOAT_DTYPES:
                raise SourceError(f"{self.model.path}: {t.name} is {t.dtype} {list(t.shape)}, expected a float "
                                  f"tensor {list(shape)}")
        gate, up, down = src["gate_bias"], src["up_bias"], src["down_bias"]
        if gate.dtype != up.dtype:
            raise SourceError(f"{self.model.path}: layer {layer}'s gate and up expert biases differ in type "
                              f"({gate.dtype}, {up.dtype})")
        sources.update(w13_bias=[gate, up], w2_bias=[down])
        return [("w13_bias", gate.dtype, (2 * inter,)), ("w2_bias", down.dtype, (hidden,))]

    def run(self) -> Index:
        self.pool = ThreadPoolExecutor(max_workers=READ_THREADS, thread_name_prefix="ftw-gguf-read")
        try:
            dense, experts, dropped = self.classify()
            check_source_tensors(str(self.model.path), self.family.name, self.config, self.source_config,
                                 {d.name: d.shape for ds in dense.values() for d in ds}, self.family_check)
            dense_params = expert_params = 0
            for layer in sorted(set(dense) | set(experts)):
                for d in sorted(dense.get(layer, []), key=lambda d: d.name):
                    dense_params += self.write_dense(d)
                if layer in experts:
                    expert_params += self.config["num_experts"] * self.write_bank(layer, experts[layer])
            for name, doc in self.side_files.items():
                _write_json_atomic(self.out / name, doc)
        except BaseException:
            self.writer.abort()
            raise
        finally:
            self.pool.shutdown(wait=True, cancel_futures=True)
            self.model.close()
        cfg = self.config
        active = dense_params + expert_params // max(1, cfg["num_experts"]) * cfg["num_experts_per_tok"]
        config = {**cfg, "num_params_total": dense_params + expert_params, "num_params_active": active,
                  "dtype": max(self.params_by_dtype, key=lambda k: self.params_by_dtype[k])}
        metadata = {
            "converter": "ft", "source_format": "gguf", "dropped_tensors": dropped, "target_dtype": "auto",
            "gguf_architecture": self.arch.name, "params_by_dtype": dict(self.params_by_dtype),
            "side_files": sorted(self.side_files),
            "gguf_metadata": {k: v for k, v in self.model.metadata.items() if not isinstance(v, list)
                              and not k.startswith("tokenizer.") and len(str(v)) <= MAX_KEPT_METADATA_CHARS},
        }
        return self.writer.finish(family=self.family.name, config=config, source_config=self.source_config, metadata=metadata)


# the GGUF's scalar metadata is kept in the FTW index for `ft show`; a longer value (a licence
# text, or a crafted one: five 60 MB strings made an index the reader refuses) is left out
MAX_KEPT_METADATA_CHARS = 64 << 10


def _write_json_atomic(path: Path, doc: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False, indent=1)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def convert_gguf(
    path: Path,
    out: Path,
    *,
    max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
    progress: Progress | None = None,
    tokenizer: bool = True,
    family_check: FamilyCheck | None = None,
) -> Index:
    """Convert the GGUF model `path` (one file, or any part of a split model) to an FTW directory `out`.

    Returns the index. Tensors keep their GGUF dtypes (block quants byte for byte); the config in
    the index is rebuilt from GGUF metadata (`source_config` is a Hugging Face-style config.json).
    With `tokenizer`, the embedded tokenizer is also written to `out` as GGUF_SIDE_FILES
    (`tokenizer.json`, `tokenizer_config.json` with the chat template); a tokenizer ft cannot rebuild
    is refused before any weight is written. `progress` gets source bytes consumed. The dense
    tensors are checked before any is written (ftw/check_tensors.py; `family_check` as for
    `convert_checkpoint`).
    """
    try:
        return _GGUFConverter(Path(path), Path(out), max_shard_bytes, progress, tokenizer, family_check).run()
    except SourceError as e:  # every refusal names the file (most name the tensor or key too)
        if str(path) in str(e):
            raise
        raise SourceError(f"{path}: {e}") from None
