"""Expert records as typed weights on any device, and the SwiGLU experts computed from them.

A record is one expert in the FTW layout (HostExpertBank row, cache slot, prefill buffer row):
the same bytes everywhere, so a cache fill is one copy and the device reads the parts in place.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from ftw import ExpertBank
from ftw.format import BLOCK_DTYPES, SWIGLU, ExpertActivation
from ftw.reader import torch_dtype_of

from ..experts.activation import activate, plain, split_rows
from ..experts.ggml_blocks import DEVICE_BLOCK_DTYPES, dequantize_blocks
from .kernels import triton_module
from .kernels.grouped_block_experts_ref import BLOCK_KINDS, part_bytes
from .kernels.grouped_fp8_experts_ref import FP8_KINDS
from .kernels.grouped_fp8_experts_ref import TILE as FP8_TILE
from .kernels.grouped_mxfp4_experts_ref import BIAS_KINDS as MXFP4_BIAS_KINDS
from .kernels.grouped_mxfp4_experts_ref import GATED_ACTS as MXFP4_ACTS

FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)
# Up to this many distinct experts (decode) a call gathers their weights and runs every token
# through each in one batched matmul. More (prefill) go in chunks of CHUNK_EXPERTS: each expert's
# tokens padded to the chunk's longest group, one batched matmul per chunk. Per-expert loops
# would be launch-bound on the host (~0.3 ms an expert: slower than streaming its weights).
MAX_BATCHED_EXPERTS = 16
CHUNK_EXPERTS = 32
# A chunk of experts is a run of record rows read in place (a slice: rows between its experts
# that the call does not route to are computed on zeros and dropped), so no weight is copied;
# what it holds is bounded by the call's size, whatever the routing: at most
# max(pairs / GROUP_PAIRS_PER_ROW, tokens) padded rows (the run's rows times its largest count,
# each an input, gate|up, activation and output row). Before, one hot expert in a chunk of 32
# padded all 32 to its count (a 4096-token call of a random Qwen3-30B-shaped model: ~2 GiB), and
# experts not side by side (cache slots, a bank with experts the prompt skipped) were gathered, 32
# records a chunk (288 MiB of Qwen3-30B-A3B's). Where the weights are made anew (FP8 dequantized,
# a cast to the compute dtype) a run spans at most COPIED_EXPERTS rows. The fit plan's workspace
# counts these rows per token (runtime/planner/footprint.py, `_activation_bytes_per_token`).
GROUP_PAIRS_PER_ROW = 4
COPIED_EXPERTS = 8


FP8_PARTS = {"w13", "w2", "w1_scale", "w3_scale", "w2_scale"}


def fp8_parts(layout: ExpertBank, kinds) -> dict | None:
    """The layout's parts by name where the FP8 kernels read them all: w13 (gated) and w2 of one
    of `kinds` (its FP8 types) with their float32 block scales (w1_scale, w3_scale, w2_scale).
    Else None."""
    parts = {p.name: p for p in layout.parts}
    if not layout.activation.gated or set(parts) != FP8_PARTS or parts["w13"].dtype not in kinds or parts["w2"].dtype != parts["w13"].dtype:
        return None
    if any(parts[n].dtype != "f32" for n in ("w1_scale", "w3_scale", "w2_scale")):
        return None
    return parts


class UnsupportedOnDevice(ValueError):
    """The device cannot compute this bank's experts (a GGML block quant with no device path)."""


def check_device_layout(layout: ExpertBank) -> None:
    """Raise UnsupportedOnDevice when a part of `layout` has no device path."""
    quantized = [f"{p.name} ({p.dtype})" for p in layout.parts
                 if p.dtype in BLOCK_DTYPES and p.dtype not in DEVICE_BLOCK_DTYPES]
    if quantized:
        raise UnsupportedOnDevice(
            f"layer {layout.layer}: expert parts {', '.join(quantized)} are GGML block quants the GPU cannot read "
            f"yet (it reads {', '.join(sorted(DEVICE_BLOCK_DTYPES))}); run this model with mode='cpu' (experts on "
            "the CPU), or pull a Q4_K_M, Q5_K_M, Q6_K or Q8_0 file")


class RecordViews:
    """Typed views of the parts of expert records stored one per row of a uint8 [N, >= stride]
    tensor, laid out as `layout` says: `parts[name]` is [N, *shape] in the part's dtype, or for
    a GGML block quant its bytes [N, nbytes] (`blocks[name]` says the dtype and shape),
    dequantized as it is read (runtime/experts/ggml_blocks.py)."""

    def __init__(self, data: torch.Tensor, layout: ExpertBank) -> None:
        check_device_layout(layout)
        self.layout, self.data = layout, data
        self.block = tuple(layout.quant.get("fp8_block", (128, 128)))
        n = data.shape[0]
        self.parts: dict[str, torch.Tensor] = {}
        self.blocks: dict[str, tuple[str, tuple[int, ...]]] = {}
        for p in layout.parts:
            raw = data[:, p.offset : p.offset + p.nbytes]
            if p.dtype in BLOCK_DTYPES:
                self.parts[p.name], self.blocks[p.name] = raw, (p.dtype, tuple(p.shape))
            else:
                self.parts[p.name] = raw.view(torch_dtype_of(p.dtype)).view(n, *p.shape)

    def biases(self, rows: torch.Tensor | int | slice, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(w13_bias [n, 2I], w2_bias [n, H]) of `rows` (as `weights` takes them) in `dtype`, where
        the records have biases (gpt-oss's experts); else None."""
        if "w13_bias" not in self.parts:
            return None
        index = slice(rows, rows + 1) if isinstance(rows, int) else rows
        return self.parts["w13_bias"][index].to(dtype), self.parts["w2_bias"][index].to(dtype)

    def in_place(self, dtype: torch.dtype) -> bool:
        """Whether `weights` of a slice in `dtype` are views of the records (nothing copied)."""
        return "w13" in self.parts and not self.blocks and self.parts["w13"].dtype == self.parts["w2"].dtype == dtype

    def float_parts(self) -> dict[str, int]:
        """Where an in-place record's weights are, for a kernel that reads `data` itself: the byte
        offsets of w13 [2I, H] and w2 [H, I] within a row, and H and I."""
        parts = {p.name: p for p in self.layout.parts}
        inter2, hidden = parts["w13"].shape
        return {"w13_offset": parts["w13"].offset, "w2_offset": parts["w2"].offset, "hidden": hidden,
                "inter": inter2 // 2}

    def block_parts(self) -> dict | None:
        """Where a GGUF record's weights are, for the block kernel that reads `data` itself
        (kernels/grouped_block_experts.py): gate, up and down as (byte offset within a row, GGML
        type), and H and I; None unless the parts are w13 (or w1 and w3) and w2 of the types it
        reads, their rows whole 256-value super-blocks."""
        parts = {p.name: p for p in self.layout.parts}
        names = {"w13", "w2"} if "w13" in parts else {"w1", "w3", "w2"}
        if set(parts) != names or any(p.dtype not in BLOCK_KINDS or p.shape[-1] % 256 for p in parts.values()):
            return None
        down = parts["w2"]
        hidden, inter = down.shape
        if "w13" in parts:  # up's rows follow the gate's I rows
            w13 = parts["w13"]
            gate, up = (w13.offset, w13.dtype), (w13.offset + part_bytes(w13.dtype, inter, hidden), w13.dtype)
        else:
            gate, up = (parts["w1"].offset, parts["w1"].dtype), (parts["w3"].offset, parts["w3"].dtype)
        return {"gate": gate, "up": up, "down": (down.offset, down.dtype), "hidden": hidden, "inter": inter}

    def fp8_block_parts(self) -> dict | None:
        """Where a block-scaled FP8 record's weights and scales are, for the grouped kernel that
        reads `data` itself (kernels/grouped_fp8_experts.py): gate, up and down as (the weight's
        byte offset within a row, its float32 scales'), H, I, the FP8 type and the scale block;
        None unless the parts are fp8_parts' and H and I whole tiles of that kernel."""
        parts = fp8_parts(self.layout, FP8_KINDS)
        if parts is None:
            return None
        w13, w2 = parts["w13"], parts["w2"]
        hidden, inter = w2.shape
        if hidden % FP8_TILE or inter % FP8_TILE:
            return None
        return {"gate": (w13.offset, parts["w1_scale"].offset),
                "up": (w13.offset + inter * hidden, parts["w3_scale"].offset),
                "down": (w2.offset, parts["w2_scale"].offset), "hidden": hidden, "inter": inter, "kind": w13.dtype,
                "block": tuple(self.block)}

    def mxfp4_block_parts(self) -> dict | None:
        """Where an MXFP4 record's weights and biases are, for the grouped kernel that reads `data`
        itself (kernels/grouped_mxfp4_experts.py): w13 (gate rows, then up) and w2's byte offsets,
        the biases' (-1 and a bias_kind None without), H, I and the activation with its constants;
        None unless w13 and w2 are MXFP4, the activation a gated one that kernel computes, and H
        and I whole 32-value blocks."""
        parts = {p.name: p for p in self.layout.parts}
        activation = self.layout.activation
        if set(parts) - {"w13_bias", "w2_bias"} != {"w13", "w2"} or activation.kind not in MXFP4_ACTS:
            return None
        w13, w2 = parts["w13"], parts["w2"]
        hidden, inter = w2.shape
        if w13.dtype != "mxfp4" or w2.dtype != "mxfp4" or hidden % 32 or inter % 32:
            return None
        biases = (parts.get("w13_bias"), parts.get("w2_bias"))
        if (biases[0] is None) != (biases[1] is None) or (biases[0] is not None and (
                biases[0].dtype != biases[1].dtype or biases[0].dtype not in MXFP4_BIAS_KINDS)):
            return None
        return {"w13_at": w13.offset, "w2_at": w2.offset, "w13_bias_at": biases[0].offset if biases[0] else -1,
                "w2_bias_at": biases[1].offset if biases[1] else -1,
                "bias_kind": biases[0].dtype if biases[0] else None, "hidden": hidden, "inter": inter,
                "act": activation.kind, "alpha": float(activation.alpha), "limit": float(activation.limit or 0.0)}

    def weights(self, rows: torch.Tensor | int | slice, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """(w13 [n, 2I, H] (or [n, I, H]: ExpertActivation.w13_rows), w2 [n, H, I]) of `rows` (a
        1-d index tensor on the data's device: a
        gathered copy; an int (n = 1) or a slice: read in place) in `dtype`; FP8 parts are
        dequantized with their block scales on the fly."""
        index = slice(rows, rows + 1) if isinstance(rows, int) else rows  # an int or a slice: a view
        if "w13" in self.parts:
            w13 = self._weight(index, "w13", ("w1_scale", "w3_scale"), dtype)
        else:  # gate and up stored apart (GGUF experts whose types differ)
            w13 = torch.cat([self._weight(index, "w1", (), dtype), self._weight(index, "w3", (), dtype)], dim=1)
        return w13, self._weight(index, "w2", ("w2_scale",), dtype)

    def _weight(self, index: torch.Tensor | slice, name: str, scale_names: tuple[str, ...],
                dtype: torch.dtype) -> torch.Tensor:
        w = self.parts[name][index]  # [n, R, C]; a block quant's bytes [n, nbytes]
        if name in self.blocks:
            return dequantize_blocks(w, *self.blocks[name]).to(dtype)
        scales = [self.parts[s][index] for s in scale_names if s in self.parts]
        if w.dtype in FP8 and scales:
            return dequantize_fp8(w, scales, self.block).to(dtype)
        return w.to(dtype)


def dequantize_fp8(w: torch.Tensor, scales: list[torch.Tensor], block: tuple[int, ...]) -> torch.Tensor:
    """w [n, R, C] FP8 times its [block x block] scales (DeepSeek's weight_scale_inv) -> float32.
    Several scale tensors cover consecutive row ranges (w13: the w1 rows, then the w3 rows)."""
    out = w.to(torch.float32)
    rows = w.shape[1] // len(scales)
    for i, scale in enumerate(scales):
        part = out[:, i * rows : (i + 1) * rows]  # [n, r, C]
        expanded = scale.to(torch.float32).repeat_interleave(block[0], 1).repeat_interleave(block[1], 2)
        part.mul_(expanded[:, : part.shape[1], : part.shape[2]])
    return out


def swiglu_experts(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor,
                   activation: ExpertActivation = SWIGLU,
                   biases: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """x [T, H] (every token through every expert) or [n, T, H] (expert i's own tokens) through n
    experts: w13 [n, 2I, H] ([n, I, H] where `activation` is not gated), w2 [n, H, I] -> [n, T, H];
    gate and up combined by `activation` (the bank layout's); `biases` (w13_bias [n, 2I], w2_bias
    [n, H]: `RecordViews.biases`) added to each projection's output where the records have them."""
    h = torch.matmul(x, w13.transpose(1, 2))  # [n, T, 2I]
    if biases is not None:
        h = h + biases[0][:, None, :]
    gate, up = split_rows(activation, h)
    y = torch.matmul(activate(activation, gate, up), w2.transpose(1, 2))  # [n, T, H]
    return y if biases is None else y + biases[1][:, None, :]


@dataclass
class PairPlan:
    """The (token, k) pairs one group of experts computes, sorted by record row, planned on the
    host (where the routing already is) and uploaded in one copy, so computing them needs no
    device sync: `pairs` (flat index into [T*K]), `tokens`, `inverse` (position in `rows`),
    `position` (within its row's group) [P] and `rows` [n] on the device; `rows_host`,
    `counts_host` (pairs per row) on the host."""

    pairs: torch.Tensor
    tokens: torch.Tensor
    inverse: torch.Tensor
    position: torch.Tensor
    rows: torch.Tensor
    starts: torch.Tensor  # [n] on the device: each row's first sorted pair
    counts: torch.Tensor  # [n] on the device: each row's pairs
    rows_host: list[int]
    counts_host: list[int]

    @staticmethod
    def of_every_expert(expert_ids: torch.Tensor, host_ids: torch.Tensor) -> PairPlan | None:
        """`build` with every expert's row its id (a whole bank on the device), computed where
        `expert_ids` [T, K] is: nothing is uploaded (on CUDA an upload would wait behind the bank
        the copy stream may be streaming); the host's lists from `host_ids`, its copy there."""
        top_k = expert_ids.shape[1]
        flat = expert_ids.reshape(-1).to(torch.int64)
        if flat.numel() == 0:
            return None
        pairs = torch.argsort(flat, stable=True)
        rows = flat[pairs]
        unique, counts = torch.unique_consecutive(rows, return_counts=True)
        inverse = torch.repeat_interleave(torch.arange(unique.numel(), device=rows.device), counts,
                                          output_size=rows.numel())
        starts = torch.cumsum(counts, 0) - counts
        position = torch.arange(rows.numel(), device=rows.device) - starts[inverse]
        host_rows, host_counts = np.unique(host_ids.reshape(-1).numpy(), return_counts=True)
        return PairPlan(pairs, pairs // top_k, inverse, position, unique, starts, counts, host_rows.tolist(),
                        host_counts.tolist())

    @staticmethod
    def build(expert_ids: torch.Tensor, row_of: np.ndarray | torch.Tensor, upload: Callable[[torch.Tensor], torch.Tensor]) -> PairPlan | None:
        """Pairs whose expert e has row_of[e] >= 0 (a slot, or a row of a streamed bank);
        `expert_ids` [T, K] and `row_of` [E] int64 on the host. None when there are none.

        Planned in numpy: a few thousand ints, where torch's host ops would each enter its
        intra-op thread pool (repeat_interleave does at any size) and wait there for its threads:
        0.45-0.8 ms a call on the GPU host, in each of a 512-token prompt's ~480 rounds at
        -ncmoe 16's budget (BENCHMARKS.md, 2026-12-07)."""
        top_k = expert_ids.shape[1]
        rows = np.asarray(row_of)[expert_ids.reshape(-1).numpy()]
        pairs = np.flatnonzero(rows >= 0)
        if pairs.size == 0:
            return None
        rows = rows[pairs]
        order = np.argsort(rows, kind="stable")
        pairs, rows = pairs[order], rows[order]
        firsts = np.flatnonzero(np.diff(rows, prepend=-1))  # each row's first sorted pair
        counts = np.diff(firsts, append=rows.size)
        inverse = np.repeat(np.arange(firsts.size), counts)
        position = np.arange(pairs.size) - firsts[inverse]
        unique = rows[firsts]
        p, n = pairs.size, unique.size
        packed = upload(torch.from_numpy(np.concatenate([pairs, pairs // top_k, inverse, position, unique, firsts,
                                                         counts]).astype(np.int64)))
        return PairPlan(*packed[: 4 * p].view(4, p), *packed[4 * p:].view(3, n), unique.tolist(), counts.tolist())


def experts_from_records(x: torch.Tensor, weights: torch.Tensor, plan: PairPlan, views: RecordViews,
                         dtype: torch.dtype, out: torch.Tensor) -> None:
    """out[t] += sum over the plan's pairs (t, k) of weights[t, k] * expert(x[t]), each expert read
    from its row of `views`; x, weights [T, K] and out on one device.

    Few distinct experts (decode): gather their weights, one batched matmul for all tokens.
    Many (prefill): on CUDA, float records in the compute dtype, GGUF records (Q4_K, Q5_K, Q6_K,
    Q8_0 parts, dequantized per tile), block-scaled FP8 records and MXFP4 ones with their biases
    and activation (widened per tile) go through two grouped-GEMM launches for the whole call
    (`grouped_kind` says which kernel); else runs of record rows, each
    expert over its own tokens padded to the run's longest group, bounded as GROUP_PAIRS_PER_ROW
    and COPIED_EXPERTS say.
    """
    xs = x.to(dtype)
    pair_weights = weights.reshape(-1)[plan.pairs].to(dtype)  # [P]
    num = len(plan.rows_host)
    max_rows = max(plan.pairs.numel() // GROUP_PAIRS_PER_ROW, x.shape[0])
    if num <= MAX_BATCHED_EXPERTS and x.shape[0] * num <= min(4 * plan.pairs.numel(), max_rows):
        w13, w2 = views.weights(plan.rows, dtype)
        y = swiglu_experts(xs, w13, w2, views.layout.activation, views.biases(plan.rows, dtype))  # [n, T, H]
        out.index_add_(0, plan.tokens, (y[plan.inverse, plan.tokens] * pair_weights[:, None]).to(out.dtype))
        return
    grouped = _grouped_kernel(x, views, dtype)
    if grouped is not None:  # two launches for the whole call (kernels/grouped_experts.py, grouped_block_experts.py)
        grouped(xs, views.data, rows=plan.rows, starts=plan.starts, counts=plan.counts, tokens=plan.tokens,
                pair_weights=pair_weights.float(), max_count=max(plan.counts_host), out=out)
        return
    pair_rows = plan.rows[plan.inverse]  # [P]: each pair's record row
    max_span = CHUNK_EXPERTS if views.in_place(dtype) else COPIED_EXPERTS
    start = 0
    for first, last in expert_chunks(plan.rows_host, plan.counts_host, max_rows, max_span):
        counts = plan.counts_host[first:last]
        end = start + sum(counts)
        low, high = plan.rows_host[first], plan.rows_host[last - 1]
        tokens, position = plan.tokens[start:end], plan.position[start:end]
        group = pair_rows[start:end] - low  # the pair's row within the run
        padded = torch.zeros(high + 1 - low, max(counts), x.shape[1], dtype=dtype, device=x.device)  # [n, t, H]
        padded[group, position] = xs[tokens]
        w13, w2 = views.weights(slice(low, high + 1), dtype)
        y = swiglu_experts(padded, w13, w2, views.layout.activation, views.biases(slice(low, high + 1), dtype))
        del padded, w13, w2  # (before the rows below are taken: what a run holds at once stays its rows')
        picked = y[group, position]  # [P', H]
        del y
        picked *= pair_weights[start:end, None]
        out.index_add_(0, tokens, picked.to(out.dtype))
        del picked  # (not alive beside the next run's rows)
        start = end


def _grouped_kernel(x: torch.Tensor, views: RecordViews, dtype: torch.dtype) -> Callable | None:
    """The grouped-GEMM kernel for a many-expert call, where it applies (on CUDA: `grouped_call`).
    Else None (padded runs of experts, in experts_from_records)."""
    return grouped_call(views, dtype) if x.device.type == "cuda" else None


def grouped_kind(views: RecordViews, dtype: torch.dtype) -> str | None:
    """Which grouped kernel module computes a many-expert call over `views` in `dtype` (bf16 or
    f16) on CUDA: "grouped_experts" for float records read in place in the compute dtype,
    "grouped_fp8_experts" for block-scaled FP8 records (RecordViews.fp8_block_parts),
    "grouped_mxfp4_experts" for MXFP4 records, biases and a clamped SwiGLU included (gpt-oss's:
    RecordViews.mxfp4_block_parts), "grouped_block_experts" for GGUF records of the types it reads
    (RecordViews.block_parts); None for the others (f32 records, FP8 without block scales, other
    GGML types, an activation other than plain silu(gate) * up or biases beside those)."""
    if dtype not in (torch.bfloat16, torch.float16):
        return None
    if views.mxfp4_block_parts() is not None:  # (with its biases and activation)
        return "grouped_mxfp4_experts"
    if not plain(views.layout.activation) or "w13_bias" in views.parts:
        return None
    if views.in_place(dtype):
        return "grouped_experts"
    if views.fp8_block_parts() is not None:
        return "grouped_fp8_experts"
    return "grouped_block_experts" if views.blocks and views.block_parts() is not None else None


def grouped_call(views: RecordViews, dtype: torch.dtype) -> Callable | None:
    """`grouped_kind`'s kernel with the records' part offsets bound: called as (x, records, rows=,
    starts=, counts=, tokens=, pair_weights=, max_count=, out=); None where none applies or triton
    is not installed."""
    kind = grouped_kind(views, dtype)
    module = triton_module(kind) if kind is not None else None
    if module is None:
        return None
    if kind == "grouped_experts":
        return functools.partial(module.grouped_experts, **views.float_parts())
    if kind == "grouped_fp8_experts":
        return functools.partial(module.grouped_fp8_experts, **views.fp8_block_parts())
    if kind == "grouped_mxfp4_experts":
        return functools.partial(module.grouped_mxfp4_experts, **views.mxfp4_block_parts())
    return functools.partial(module.grouped_block_experts, **views.block_parts())


def expert_chunks(rows: list[int], counts: list[int], max_rows: int, max_span: int) -> list[tuple[int, int]]:
    """[first, last) runs of a plan's experts (in row order; `counts[i]` pairs for the i-th, at
    `rows[i]`) computed together: spanning at most `max_span` rows, padded to at most `max_rows`
    rows (the rows spanned times the largest count; one expert alone may have more)."""
    chunks, first, longest = [], 0, 0
    for i, count in enumerate(counts):
        wider = max(longest, count)
        span = rows[i] - rows[first] + 1
        if i > first and (span * wider > max_rows or span > max_span):
            chunks.append((first, i))
            first, wider = i, count
        longest = wider
    if counts:
        chunks.append((first, len(counts)))
    return chunks
