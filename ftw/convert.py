"""Hugging Face safetensors checkpoint -> FTW, streaming, in bounded memory.

Dense tensors are copied in 64 MiB chunks; experts are assembled one at a time into the
runtime's record layout (gate and up fused as `w13` [2I, H], `down` as `w2` [H, I], FP8 block
scales or gpt-oss's biases beside them), so peak memory is a few chunks plus one expert whatever
the model size. gpt-oss's MXFP4 experts are kept as they are (GGML `mxfp4` records, the bytes
repacked: ftw/fp4.py) at DTYPE auto, or dequantized exactly to a float DTYPE asked for (ftw/mxfp4.py).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import torch

from .check_tensors import FamilyCheck, check_source_tensors
from .config_file import MAX_CONFIG_BYTES, load_config  # noqa: F401 - re-exported: ftw.convert.load_config
from .errors import SourceError
from .families import (
    ExpertTensorName,
    Family,
    check_dense_shape,
    family_for_config,
    index_in_name,
    normalized_config,
    parse_expert_name,
    weight_block_size,
)
from .format import Index, nbytes_of
from .fp4 import PACKED_DTYPES as FP4_PACKED_DTYPES
from .fp4 import SCALE_DTYPES as FP4_SCALE_DTYPES
from .fp4 import dequantize_fp4, fp4_shapes, to_mxfp4_rows
from .mxfp4 import check_mxfp4_pair, dequantize_mxfp4, mxfp4_shapes
from .rangeio import CHUNK_BYTES, readahead
from .reader import TORCH_DTYPES
from .safetensors_source import SafetensorsCheckpoint, SourceTensor
from .writer import DEFAULT_MAX_SHARD_BYTES, FTWWriter

FLOAT_DTYPES = ("f32", "f16", "bf16")
FP8_DTYPES = ("f8_e4m3", "f8_e5m2")
TARGET_DTYPES = ("auto", *FLOAT_DTYPES, "fp8")
READAHEAD_BYTES = 256 << 20  # source bytes read ahead of the writer
READ_THREADS = 4
FUSED_EXTRAS = ("_bias", "_scales")  # fused expert tensors beside the weights (gpt-oss's)
Progress = Callable[[int], None]
T = TypeVar("T")


@dataclass
class _LayerExperts:
    """The source tensors of one layer's routed experts, in whichever layout the checkpoint uses."""

    per_expert: dict[tuple[int, str, str], SourceTensor]  # (expert, proj, what) -> tensor
    # proj -> [E, ...] tensor, and gpt-oss's "{proj}_bias", "{proj}_blocks" and "{proj}_scales"
    fused: dict[str, SourceTensor]

    def weight_dtype(self) -> str:
        """The weights' dtype; MXFP4 ones (`_blocks`) count as the bf16 they are dequantized to."""
        tensors = [t for (_, _, what), t in self.per_expert.items() if what == "weight"]
        dtypes = {t.dtype for t in tensors} or {"bf16" if key.endswith("_blocks") else t.dtype
                                                for key, t in self.fused.items() if not key.endswith(FUSED_EXTRAS)}
        if len(dtypes) != 1:
            raise SourceError(f"expert weights of one layer mix dtypes {sorted(dtypes)}")
        return dtypes.pop()


class _Converter:
    def __init__(self, src: Path, out: Path, dtype: str, max_shard_bytes: int, progress: Progress | None,
                 family_check: FamilyCheck | None = None) -> None:
        if dtype not in TARGET_DTYPES:
            raise SourceError(f"dtype {dtype!r} is not supported; choose one of {', '.join(TARGET_DTYPES)}")
        self.source_config = load_config(src)
        self.family: Family = family_for_config(self.source_config)
        self.config = normalized_config(self.family, self.source_config)
        self.target = dtype
        self.progress = progress or (lambda n: None)
        self.src, self.family_check = src, family_check
        self.ckpt = SafetensorsCheckpoint(src)
        self.writer = FTWWriter(out, max_shard_bytes=max_shard_bytes)
        quant = self.family.text_config(self.source_config).get("quantization_config") or self.source_config.get("quantization_config") or {}
        self.fp8_block = weight_block_size(quant)
        self.transposed: set[str] = set()  # dense tensors written as the transpose of the checkpoint's (Family.transposed)

    # -- classification -------------------------------------------------------------------------

    def classify(self) -> tuple[list[SourceTensor], dict[int, _LayerExperts], int]:
        num_layers = self.config["num_layers"]
        dense: list[SourceTensor] = []
        experts: dict[int, _LayerExperts] = defaultdict(lambda: _LayerExperts({}, {}))
        dropped = 0
        renamed: dict[str, str] = {}  # the runtime's name -> the checkpoint's (Family.tensor_name)
        for source_name, t in self.ckpt.tensors.items():
            name = self.family.tensor_name(source_name)
            if name in renamed:
                raise SourceError(f"tensors {renamed[name]!r} and {source_name!r} are both {name!r}; the checkpoint "
                                  "holds two copies and ft cannot tell which is meant")
            renamed[name] = source_name
            t = t if name == source_name else replace(t, name=name)
            if any(p.search(source_name) for p in self.family.transposed):
                if len(t.shape) != 2:
                    raise SourceError(f"{t.file}: tensor {source_name!r} is {list(t.shape)}; ft reads it as a matrix "
                                      "stored transposed")
                self.transposed.add(name)
                t = replace(t, shape=t.shape[::-1])
            if not self.family.keeps(name, num_layers):
                dropped += 1
                continue
            parsed = parse_expert_name(name)
            if parsed is None:
                try:
                    check_dense_shape(name, t.shape, self.config)
                except SourceError as e:
                    raise SourceError(f"{t.file}: {e}") from None
                dense.append(t)
            else:
                self._add_expert_tensor(experts[parsed.layer], parsed, t)
        expected = self.config["moe_layers"]
        if sorted(experts) != expected:
            raise SourceError(
                f"the checkpoint has routed experts in layers {sorted(experts)}, the config says {expected}; "
                "the download is incomplete or the config does not belong to these weights"
            )
        return dense, dict(experts), dropped

    def _add_expert_tensor(self, layer: _LayerExperts, parsed: ExpertTensorName, t: SourceTensor) -> None:
        slots: dict[Any, SourceTensor] = layer.fused if parsed.expert is None else layer.per_expert
        fused_key = parsed.proj if parsed.what == "weight" else f"{parsed.proj}_{parsed.what}"
        key: Any = fused_key if parsed.expert is None else (parsed.expert, parsed.proj, parsed.what)
        if key in slots:  # two names of one tensor (a per-expert and a Mixtral name, a fused one with ".weight")
            raise SourceError(f"tensors {slots[key].name!r} and {t.name!r} are both layer {parsed.layer}'s "
                              f"{parsed.proj} {'of every expert' if parsed.expert is None else f'of expert {parsed.expert}'}; "
                              "the checkpoint holds two copies and ft cannot tell which is meant")
        slots[key] = t

    # -- dtype handling -------------------------------------------------------------------------

    def stored_dtype(self, source_dtype: str) -> str:
        if source_dtype in FP8_DTYPES:
            if self.target in ("auto", "fp8"):
                return source_dtype
            raise SourceError(
                f"converting FP8 weights to {self.target} is not supported yet; use DTYPE auto or fp8 for this checkpoint"
            )
        if source_dtype in FLOAT_DTYPES:
            if self.target == "fp8":
                raise SourceError("quantizing to fp8 at pull time is not supported yet; pull an FP8 checkpoint instead")
            return source_dtype if self.target == "auto" else self.target
        return source_dtype

    def cast_bytes(self, data: np.ndarray, source_dtype: str, target_dtype: str) -> np.ndarray:
        if source_dtype == target_dtype:
            return data
        t = torch.from_numpy(data).view(TORCH_DTYPES[source_dtype]).to(TORCH_DTYPES[target_dtype])
        return t.view(torch.uint8).numpy()

    def chunks(self, t: SourceTensor, target_dtype: str):
        """The bytes of `t` converted to `target_dtype`, chunked on element boundaries."""
        itemsize = max(1, t.nbytes // max(1, math.prod(t.shape)))
        step = CHUNK_BYTES - CHUNK_BYTES % (itemsize * 8)
        starts = range(0, t.nbytes, step)
        read = lambda i: self.ckpt.read_bytes(t, starts[i], min(step, t.nbytes - starts[i]))  # noqa: E731
        for chunk in readahead(self.pool, read, len(starts), depth=2):
            yield self.cast_bytes(chunk, t.dtype, target_dtype)
            self.progress(chunk.nbytes)

    # -- writing --------------------------------------------------------------------------------

    def write_dense(self, t: SourceTensor) -> int:
        target = self.stored_dtype(t.dtype) if not t.name.endswith("_scale_inv") else _scale_dtype(t.dtype)
        chunks = self.chunks(t, target)
        if t.name in self.transposed:  # (read whole: routers and shared experts, a few hundred MB at most)
            rows, cols = t.shape  # (the runtime's; the checkpoint holds [cols, rows])
            data = np.concatenate([np.ravel(c) for c in chunks])
            itemsize = data.nbytes // (rows * cols)
            matrix = data.view(np.dtype(f"V{itemsize}")).reshape(cols, rows)
            chunks = iter([np.ascontiguousarray(matrix.T).view(np.uint8).ravel()])
        self.writer.add_tensor(t.name, target, t.shape, chunks)
        return 0 if t.name.endswith("_scale_inv") else math.prod(t.shape)

    def write_bank(self, layer: int, src: _LayerExperts) -> int:
        """Write one layer's experts; returns the parameter count of one expert."""
        cfg = self.config
        num_experts, inter, hidden = cfg["num_experts"], cfg["moe_intermediate_size"], cfg["hidden_size"]
        source_dtype = src.weight_dtype()
        fp4 = self._fp4_experts(layer, src, source_dtype)
        kept_mxfp4 = self.target == "auto" and any(key.endswith("_blocks") for key in src.fused)  # (gpt-oss's)
        dtype = "mxfp4" if kept_mxfp4 else fp4 or self.stored_dtype(source_dtype)
        activation = self.family.expert_activation(self.family.text_config(self.source_config))
        rows = activation.w13_rows(inter)  # (the up rows alone where the experts are not gated: Nemotron-H's)
        if not activation.gated and (fp4 or kept_mxfp4 or source_dtype in FP8_DTYPES
                                    or any(key.endswith(FUSED_EXTRAS) for key in src.fused)):
            raise SourceError(f"layer {layer}: {activation.kind} experts (not gated) are read as float weights "
                              "without biases; this checkpoint's are quantized or biased")
        parts: list[tuple[str, str, tuple[int, ...]]] = [("w13", dtype, (rows, hidden)), ("w2", dtype, (hidden, inter))]
        biased = "gate_up_proj_bias" in src.fused  # (gpt-oss's; _fused_reader checks that down_proj_bias is there too)
        if biased:  # (in their own dtype, or the cast: MXFP4 weights come with bf16 biases, a test's with f32)
            bias_dtype = self.stored_dtype(src.fused["gate_up_proj_bias"].dtype)
            parts += [("w13_bias", bias_dtype, (2 * inter,)), ("w2_bias", bias_dtype, (hidden,))]
        quant: dict[str, Any] = {}
        if source_dtype in FP8_DTYPES:
            if src.fused:
                raise SourceError(f"layer {layer}: fused FP8 expert tensors are not supported yet")
            for proj, part in (("gate_proj", "w1_scale"), ("up_proj", "w3_scale"), ("down_proj", "w2_scale")):
                scale = src.per_expert.get((0, proj, "weight_scale_inv"))
                if scale is None:
                    raise SourceError(f"layer {layer}: FP8 expert weights without {proj}.weight_scale_inv block scales")
                parts.append((part, _scale_dtype(scale.dtype), scale.shape))
            quant = {"fp8_block": self.fp8_block, "scale": "weight_scale_inv"}
        read_expert = (self._fused_reader(layer, src, inter, hidden, kept_mxfp4, activation.gated) if src.fused
                       else self._per_expert_reader(layer, src, inter, hidden, fp4, activation.gated))
        expert_bytes = sum(nbytes_of(d, shape) for _, d, shape in parts)
        depth = max(2, READAHEAD_BYTES // max(1, expert_bytes))
        with self.writer.expert_bank(layer, num_experts, parts, quant, activation) as bank:
            for e, pieces in enumerate(readahead(self.pool, read_expert, num_experts, depth)):
                bank.write_expert(e, {name: [self.cast_bytes(b, b_dtype, d) for b, b_dtype in pieces[name]]
                                      for name, d, _ in parts})
                self.progress(sum(b.nbytes for bufs in pieces.values() for b, _ in bufs))
        return (rows + inter) * hidden + (rows + hidden if biased else 0)

    def _fp4_experts(self, layer: int, src: _LayerExperts, source_dtype: str) -> str | None:
        """Where the layer's experts are DeepSeek-V4's FP4 (`expert_dtype` "fp4": nibble pairs with
        e8m0 scales, ftw/fp4.py), what they are stored as: GGML mxfp4 blocks as they are (DTYPE
        auto), or the float DTYPE asked for; else None."""
        config = self.family.text_config(self.source_config)
        quant = config.get("quantization_config") or self.source_config.get("quantization_config") or {}
        declared = config.get("expert_dtype") or (quant.get("expert_dtype") if isinstance(quant, dict) else None)
        if declared != "fp4" or source_dtype not in FP4_PACKED_DTYPES:
            return None
        if src.fused:
            raise SourceError(f"layer {layer}: fused FP4 expert tensors are not supported (the release's are per expert)")
        if self.target == "fp8":
            raise SourceError("FP4 experts cannot be stored as fp8; use DTYPE auto (kept FP4) or a float dtype")
        return "mxfp4" if self.target == "auto" else self.stored_dtype("f32")

    def _per_expert_reader(self, layer: int, src: _LayerExperts, inter: int, hidden: int, fp4: str | None = None,
                           gated: bool = True):
        """Each expert's pieces; `fp4` (`_fp4_experts`): its weights are FP4, read as that dtype;
        not `gated`: w13 is up_proj alone (Nemotron-H's experts have no gate_proj)."""
        num_experts = self.config["num_experts"]
        beyond = sorted({e for e, _, _ in src.per_expert if e >= num_experts})
        if beyond:
            raise SourceError(f"layer {layer}: experts {beyond[:4]} are beyond the {num_experts} of config.json; "
                              "the checkpoint does not match its config")
        # each weight's shape as config.json says (its bytes alone would let a transposed tensor
        # through as garbage); each scale's as expert 0's
        shapes = {"gate_proj": (inter, hidden), "up_proj": (inter, hidden), "down_proj": (hidden, inter)}

        def get(e: int, proj: str, what: str = "weight") -> tuple[np.ndarray, str]:
            t = src.per_expert.get((e, proj, what))
            if t is None:
                raise SourceError(f"layer {layer} expert {e}: {proj}.{what} is missing from the checkpoint")
            want = shapes[proj] if what == "weight" else tuple(src.per_expert[(0, proj, what)].shape)
            if tuple(t.shape) != want:
                raise SourceError(f"layer {layer} expert {e}: {proj}.{what} has shape {list(t.shape)}, not "
                                  f"{list(want)} (hidden_size {hidden}, moe_intermediate_size {inter} in "
                                  "config.json); the checkpoint does not match its config")
            return self.ckpt.read_bytes(t), t.dtype

        def fp4_weight(e: int, proj: str) -> tuple[np.ndarray, str]:
            """One FP4 weight and its scales: as GGML mxfp4 rows, or dequantized (float32)."""
            packed_shape, scale_shape = fp4_shapes(*shapes[proj])
            for what, want, dtypes in (("weight", packed_shape, FP4_PACKED_DTYPES), ("weight_scale_inv", scale_shape,
                                                                                      FP4_SCALE_DTYPES)):
                t = src.per_expert.get((e, proj, what))
                if t is None or tuple(t.shape) != want or t.dtype not in dtypes:
                    found = "missing" if t is None else f"{t.dtype} {list(t.shape)}"
                    raise SourceError(f"layer {layer} expert {e}: {proj}.{what} is {found}, not {' or '.join(dtypes)} "
                                      f"{list(want)} (FP4 of [{shapes[proj][0]}, {shapes[proj][1]}])")
            packed = self.ckpt.read_bytes(src.per_expert[(e, proj, "weight")]).reshape(packed_shape)
            scales = self.ckpt.read_bytes(src.per_expert[(e, proj, "weight_scale_inv")]).reshape(scale_shape)
            if fp4 == "mxfp4":
                return to_mxfp4_rows(packed, scales).reshape(-1), "mxfp4"
            return dequantize_fp4(packed, scales).view(np.uint8).reshape(-1), "f32"

        def read(e: int) -> dict[str, list[tuple[np.ndarray, str]]]:
            if fp4 is not None:
                return {"w13": [fp4_weight(e, "gate_proj"), fp4_weight(e, "up_proj")], "w2": [fp4_weight(e, "down_proj")]}
            pieces = {"w13": [get(e, "gate_proj"), get(e, "up_proj")] if gated else [get(e, "up_proj")],
                      "w2": [get(e, "down_proj")]}
            if (0, "gate_proj", "weight_scale_inv") in src.per_expert:
                pieces["w1_scale"] = [get(e, "gate_proj", "weight_scale_inv")]
                pieces["w3_scale"] = [get(e, "up_proj", "weight_scale_inv")]
                pieces["w2_scale"] = [get(e, "down_proj", "weight_scale_inv")]
            return pieces

        return read

    def _fused_reader(self, layer: int, src: _LayerExperts, inter: int, hidden: int, kept_mxfp4: bool = False,
                      gated: bool = True):
        """Each expert's pieces from fused tensors; `kept_mxfp4`: MXFP4 weights as GGML mxfp4 rows
        (else dequantized to bf16, exactly); not `gated`: w13 is up_proj alone (Nemotron-H's)."""
        num_experts = self.config["num_experts"]
        # w13 from one gate_up_proj, or from a gate_proj and an up_proj apart (DBRX's w1 and v1); each
        # weight a float tensor or MXFP4 blocks and scales (gpt-oss's release); gpt-oss's biases beside them
        w13 = ("gate_up_proj",) if {"gate_up_proj", "gate_up_proj_blocks"} & set(src.fused) else ("gate_proj", "up_proj")
        if not gated:
            w13 = ("up_proj",)
        needed = (*w13, "down_proj")
        mxfp4 = {p for p in needed if p + "_blocks" in src.fused}
        expected = {p for p in needed if p not in mxfp4} | {p + end for p in mxfp4 for end in ("_blocks", "_scales")}
        biases = {"gate_up_proj_bias": 2 * inter, "down_proj_bias": hidden} \
            if any(key.endswith("_bias") for key in src.fused) else {}
        if set(src.fused) != expected | set(biases):
            wanted = "gate_up_proj (or gate_proj and up_proj)" if gated else "up_proj"
            raise SourceError(f"layer {layer}: fused experts need {wanted} and "
                              "down_proj, each a float tensor or MXFP4 _blocks and _scales, and both _bias tensors "
                              f"or neither; the checkpoint has {', '.join(sorted(src.fused))}")
        # transformers' layout is gate_up [E, 2I, H] and down [E, H, I]; some exporters transpose.
        shapes = {"gate_up_proj": (2 * inter, hidden), "gate_proj": (inter, hidden), "up_proj": (inter, hidden),
                  "down_proj": (hidden, inter)}
        layouts = {p: _fused_layout(src.fused[p], num_experts, shapes[p], layer, down=p == "down_proj",
                                    transposed=self.family.fused_experts_transposed) for p in needed if p not in mxfp4}
        for p in mxfp4:
            check_mxfp4_pair(src.fused[p + "_blocks"], src.fused[p + "_scales"], num_experts, shapes[p], layer)
        for key, size in biases.items():
            if tuple(src.fused[key].shape) != (num_experts, size):
                raise SourceError(f"layer {layer}: {src.fused[key].name} has shape {list(src.fused[key].shape)}, "
                                  f"expected [{num_experts}, {size}]")
        interleaved = self.family.fused_gate_up_interleaved  # (gpt-oss: gate and up alternate along 2I)

        def of_expert(t: SourceTensor, e: int) -> np.ndarray:
            per = t.nbytes // num_experts
            return self.ckpt.read_bytes(t, e * per, per)

        def weight(proj: str, e: int) -> tuple[np.ndarray, str]:
            """One expert's [rows, cols] (its torch Linear layout) of `proj`, and its dtype."""
            if proj in mxfp4:
                blocks, scales = mxfp4_shapes(*shapes[proj])
                packed = of_expert(src.fused[proj + "_blocks"], e).reshape(blocks)
                exponents = of_expert(src.fused[proj + "_scales"], e).reshape(scales)
                if kept_mxfp4:  # (a row's bytes whole: the interleaved gate and up rows reorder alike)
                    data, dtype = to_mxfp4_rows(packed.reshape(blocks[0], -1), exponents).reshape(-1), "mxfp4"
                else:
                    values = dequantize_mxfp4(packed, exponents)
                    data, dtype = torch.from_numpy(values).to(torch.bfloat16).view(torch.uint8).numpy(), "bf16"
            else:
                t, (rows, cols, transposed) = src.fused[proj], layouts[proj]
                data, dtype = of_expert(t, e), t.dtype
                if transposed:
                    m = torch.from_numpy(data).view(TORCH_DTYPES[t.dtype]).view(rows, cols)
                    data = m.t().contiguous().flatten().view(torch.uint8).numpy()  # (flat: a one-row expert's [H, 1])
            return (_gate_rows_first(data, 2 * inter) if interleaved and proj == "gate_up_proj" else data), dtype

        def bias(key: str, e: int) -> tuple[np.ndarray, str]:
            data = of_expert(src.fused[key], e)
            return (_gate_rows_first(data, 2 * inter) if interleaved and key == "gate_up_proj_bias" else data,
                    src.fused[key].dtype)

        def read(e: int) -> dict[str, list[tuple[np.ndarray, str]]]:
            pieces = {"w13": [weight(p, e) for p in w13], "w2": [weight("down_proj", e)]}
            if biases:
                pieces.update(w13_bias=[bias("gate_up_proj_bias", e)], w2_bias=[bias("down_proj_bias", e)])
            return pieces

        return read

    def run(self) -> Index:
        try:
            dense, experts, dropped = self.classify()
            shapes = {t.name: tuple(t.shape) for t in dense if not t.name.endswith("_scale_inv")}
            check_source_tensors(f"{self.src} (*.safetensors)", self.family.name, self.config, self.source_config,
                                 shapes, self.family_check, {t.name: str(t.file) for t in dense})  # before any write
        except BaseException:
            self.ckpt.close()
            raise
        by_layer: dict[int, list[SourceTensor]] = defaultdict(list)
        for t in dense:
            m = _layer_of(t.name)
            by_layer[m].append(t)
        dense_params = expert_params = 0
        # embeddings first, then layer by layer (dense weights, then the bank), then the head
        order = sorted(by_layer, key=lambda k: (k == -2, k))
        self.pool = ThreadPoolExecutor(max_workers=READ_THREADS, thread_name_prefix="ftw-read")
        try:
            for key in order:
                for t in sorted(by_layer[key], key=lambda t: t.name):
                    dense_params += self.write_dense(t)
                if key in experts:
                    expert_params += self.config["num_experts"] * self.write_bank(key, experts.pop(key))
            for key in sorted(experts):  # MoE layers with no dense tensors of their own
                expert_params += self.config["num_experts"] * self.write_bank(key, experts[key])
        except BaseException:
            self.writer.abort()
            raise
        finally:
            self.pool.shutdown(wait=True, cancel_futures=True)
            self.ckpt.close()
        cfg = self.config
        active = dense_params + expert_params // max(1, cfg["num_experts"]) * cfg["num_experts_per_tok"]
        first_weight = next((t.dtype for t in dense if t.name.endswith("weight") and len(t.shape) == 2), "f32")
        config = {**cfg, "num_params_total": dense_params + expert_params, "num_params_active": active,
                  "dtype": self.stored_dtype(first_weight) if first_weight in FLOAT_DTYPES + FP8_DTYPES else first_weight}
        metadata = {"converter": "ft", "dropped_tensors": dropped, "target_dtype": self.target}
        return self.writer.finish(family=self.family.name, config=config, source_config=self.source_config, metadata=metadata)


def _scale_dtype(source_dtype: str) -> str:
    """What a block-scale tensor is stored as: e8m0 powers of two (DeepSeek-V4's ue8m0) as f32,
    the scales the runtime reads; the others as they are."""
    return "f32" if source_dtype == "f8_e8m0" else source_dtype


def _layer_of(name: str) -> int:
    """Sort key: -1 before the layers (embeddings), the layer number, -2 after (norm, head)."""
    parts = name.split(".")
    for i, p in enumerate(parts[:-1]):
        if p in ("layers", "blocks") and parts[i + 1].isdigit():  # (DBRX's: transformer.blocks.N.)
            return index_in_name(parts[i + 1], name)
    return -1 if "embed" in name or name.endswith(".wte.weight") else -2


def _fused_layout(t: SourceTensor, num_experts: int, expected: tuple[int, int], layer: int, *,
                  down: bool, transposed: bool | None = None) -> tuple[int, int, bool]:
    """(rows, columns, transposed) of one expert's slice of the fused `t`: [E, *expected] or its
    transpose (`_orientation`; `transposed` where the family says which), or DBRX's flat
    [E * I, H] for each projection, whose slices are [I, H]: the down projection's transposed,
    whatever I and H are."""
    if len(t.shape) == 2:
        inter, hidden = (expected[1], expected[0]) if down else expected
        if tuple(t.shape) != (num_experts * inter, hidden):
            raise SourceError(f"layer {layer}: {t.name} has shape {list(t.shape)}, expected [{num_experts * inter}, "
                              f"{hidden}] ({num_experts} experts of {inter} rows)")
        return inter, hidden, down
    transposed = _orientation(t, num_experts, expected, layer, transposed)
    return t.shape[1], t.shape[2], transposed


def _orientation(t: SourceTensor, num_experts: int, expected: tuple[int, int], layer: int,
                 transposed: bool | None) -> bool:
    """False when `t` is [E, *expected], True when it is [E, *reversed(expected)]; where the family
    says which (`transposed`), only that one is taken (a square slice fits both)."""
    if t.shape == (num_experts, *expected) and not transposed:
        return False
    if t.shape == (num_experts, expected[1], expected[0]) and transposed is not False:
        return True
    want = expected[::-1] if transposed else expected
    raise SourceError(f"layer {layer}: {t.name} has shape {list(t.shape)}, expected [{num_experts}, {want[0]}, {want[1]}]")


def _gate_rows_first(data: np.ndarray, rows: int) -> np.ndarray:
    """The bytes of `rows` rows whose even rows are the gate's and odd ones the up projection's
    (gpt-oss's interleaved gate_up_proj, or its bias), reordered into FTW's gate rows, then up."""
    m = data.reshape(rows, -1)
    return np.concatenate([m[0::2], m[1::2]]).reshape(-1)


def convert_checkpoint(
    src: Path,
    out: Path,
    *,
    dtype: str = "auto",
    max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
    progress: Progress | None = None,
    family_check: FamilyCheck | None = None,
) -> Index:
    """Convert the Hugging Face checkpoint in `src` to an FTW directory `out`; returns its index.

    `dtype` is "auto" (keep the source's), a float dtype to cast to, or "fp8" (source must be
    FP8). `progress` is called with the number of source bytes consumed as work proceeds.
    Before anything is written the dense tensors are checked (ftw/check_tensors.py), with
    `family_check` for the ones the family's runtime reads (`ft pull` passes the runtime's).
    """
    try:
        return _Converter(Path(src), Path(out), dtype, max_shard_bytes, progress, family_check).run()
    except SourceError as e:  # every refusal names the checkpoint (most name the file or tensor too)
        if str(src) in str(e):
            raise
        raise SourceError(f"{src}: {e}") from None


def source_dtype_summary(src: Path) -> dict[str, int]:
    """Bytes per source dtype, e.g. to size a download or describe a checkpoint."""
    totals: dict[str, int] = defaultdict(int)
    with SafetensorsCheckpoint(src) as ckpt:
        for t in ckpt.tensors.values():
            totals[t.dtype] += t.nbytes
    return dict(totals)
