"""The device share of a decode layer: every (token, k) pair whose expert the route plan put in
a cache slot (a hit, or a PCIe fill just made), computed from the slot, with fixed shapes and
no host sync.

Pairs are all T*K of the call; those the plan left to the CPU carry slot -1 and count nothing.
bf16/f16 records on CUDA go through the Triton kernel that reads the slots in place
(kernels/slot_experts.py); GGUF records of Q4_K, Q5_K, Q6_K and Q8_0 parts, and FP8 records with
their 128 x 128 block scales, through kernels that dequantize them in registers where they lie
(kernels/block_gemv.py, kernels/fp8_gemv.py: gate and up, the activation, down, a few launches);
other dtypes (the other GGML types) and the CPU gather the used slots' weights and run one batched
matmul (records.RecordViews). Every path computes the bank's own activation (ftw.format
ExpertActivation) and adds its experts' biases where the records have them (gpt-oss's): the
pairs' bias parts are gathered from their slots (a few KB a pair), so a call with biases makes its
fills before it (`fills_in_launch`).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

import torch

from ftw import ExpertBank
from ftw.format import SWIGLU, ExpertActivation
from ftw.reader import torch_dtype_of

from ..experts.activation import activate, split_rows
from .kernels import RoutePlan, triton_module
from .kernels.slot_experts_ref import ACTIVATIONS
from .records import RecordViews, fp8_parts, swiglu_experts

BIAS_PARTS = ("w13_bias", "w2_bias")


def _kernel():
    """The slot kernel (None without triton: the gather path serves)."""
    module = triton_module("slot_experts")
    return module.slot_experts if module is not None else None


_IN_PLACE_DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16}


_TOKEN_INDEX: dict[tuple[int, int, torch.device], torch.Tensor] = {}


def pairs_of(plan: RoutePlan, weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(token int32 [P], slot int32 [P] (-1: not on the device), weight [P] as routed) for P = T*K."""
    num_tokens, top_k = plan.inverse.shape
    device = plan.pair_slot.device
    token = _TOKEN_INDEX.get((num_tokens, top_k, device))
    if token is None:  # the same few decode shapes every call: made once, not a launch per call
        token = _TOKEN_INDEX[num_tokens, top_k, device] = (
            torch.arange(num_tokens, dtype=torch.int32, device=device).repeat_interleave(top_k))
    return token, plan.pair_slot, weights.reshape(-1)


def in_place_dtype(layout: ExpertBank) -> torch.dtype | None:
    """The weights' dtype when the kernel can read this layout's records in place, else None."""
    names = {p.name: p.dtype for p in layout.parts if p.name not in BIAS_PARTS}
    if set(names) != {"w13", "w2"} or names["w13"] != names["w2"]:
        return None
    return _IN_PLACE_DTYPES.get(names["w13"])


def has_biases(layout: ExpertBank) -> bool:
    return any(p.name in BIAS_PARTS for p in layout.parts)


def pair_biases(slots: torch.Tensor, slot: torch.Tensor, layout: ExpertBank) -> tuple[torch.Tensor, torch.Tensor]:
    """(gate|up bias float32 [P, 2I], down bias float32 [P, H]) of each pair's expert, read from its
    slot's bias parts (only those bytes are gathered); zeros for pairs not on the device (slot -1)."""
    on_device = (slot >= 0)[:, None]
    rows = slot.clamp(min=0).long()
    out = []
    for name in BIAS_PARTS:
        part = layout.part(name)
        raw = slots[:, part.offset: part.offset + part.nbytes][rows]  # [P, nbytes]: a gather of these bytes only
        out.append(torch.where(on_device, raw.view(torch_dtype_of(part.dtype)).float(), 0.0))
    return out[0], out[1]


def block_parts(layout: ExpertBank, kinds: Mapping[str, int] | Collection[str],
                values_per_block: Mapping[str, int] | None = None) -> dict | None:
    """The layout's weight parts by name where the block kernel reads them all (`kinds`, its GGML
    types; every part's rows a whole number of its blocks, `values_per_block`, 256-value
    super-blocks by default): w13, or w1 and w3 (gate and up stored apart), and w2; the biases
    beside them (gpt-oss's) are read by `pair_biases`. Else None."""
    parts = {p.name: p for p in layout.parts if p.name not in BIAS_PARTS}
    names = {"w13", "w2"} if "w13" in parts else {"w1", "w3", "w2"}
    per_block = values_per_block or {}
    if set(parts) != names or any(p.dtype not in kinds or p.shape[-1] % per_block.get(p.dtype, 256)
                                  for p in parts.values()):
        return None
    return parts


def block_slot_experts(x: torch.Tensor, token: torch.Tensor, slot: torch.Tensor, weight: torch.Tensor,
                       slots: torch.Tensor, parts: dict, compute_dtype: torch.dtype, out: torch.Tensor,
                       gemv, activation: ExpertActivation = SWIGLU,
                       biases: tuple[torch.Tensor, torch.Tensor] | None = None) -> None:
    """out += each device pair's weight x its expert(x[token]), the GGUF parts (`block_parts`)
    read in place from the slots by `gemv` (kernels/block_gemv.block_gemv, or a twin), plus
    `biases` (`pair_biases`: gate|up [P, 2I], down [P, H]) where the records have them; pairs with
    slot -1 add zeros."""

    def rows_times(name: str, inputs: torch.Tensor, by: torch.Tensor) -> torch.Tensor:
        part = parts[name]
        return gemv(inputs, by, slots, slot, part_offset=part.offset, kind=part.dtype, rows=part.shape[0],
                    cols=part.shape[1])

    def gate_up(xs: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor]:
        if "w13" in parts:  # (the up rows alone where the experts are not gated)
            gate, up = split_rows(activation, rows_times("w13", xs, token))
        else:
            gate, up = rows_times("w1", xs, token), rows_times("w3", xs, token)
        if biases is None:
            return gate, up
        gate_bias, up_bias = split_rows(activation, biases[0])
        return (None if gate is None else gate + gate_bias), up + up_bias

    def down(act: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        y = rows_times("w2", act, index)
        return y if biases is None else y + biases[1]

    _swiglu_pairs(x, token, weight, compute_dtype, out, gate_up, down, activation)


def fp8_slot_experts(x: torch.Tensor, token: torch.Tensor, slot: torch.Tensor, weight: torch.Tensor,
                     slots: torch.Tensor, parts: dict, block: tuple[int, int], compute_dtype: torch.dtype,
                     out: torch.Tensor, gemv, activation: ExpertActivation = SWIGLU) -> None:
    """out += each device pair's weight x its expert(x[token]), the FP8 parts (`fp8_parts`, scale
    blocks of `block`) read in place from the slots by `gemv` (kernels/fp8_gemv.fp8_gemv)."""
    w13, w2 = parts["w13"], parts["w2"]
    inter, hidden = w13.shape[0] // 2, w13.shape[1]

    def rows_times(offset: int, scale: str, rows: int, cols: int, inputs: torch.Tensor,
                   by: torch.Tensor) -> torch.Tensor:
        return gemv(inputs, by, slots, slot, part_offset=offset, scale_offset=parts[scale].offset, kind=w13.dtype,
                    rows=rows, cols=cols, block=block)

    def gate_up(xs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # w13's gate rows, then its up rows
        return (rows_times(w13.offset, "w1_scale", inter, hidden, xs, token),
                rows_times(w13.offset + inter * hidden, "w3_scale", inter, hidden, xs, token))

    _swiglu_pairs(x, token, weight, compute_dtype, out, gate_up,
                  lambda act, index: rows_times(w2.offset, "w2_scale", hidden, inter, act, index), activation)


def _swiglu_pairs(x: torch.Tensor, token: torch.Tensor, weight: torch.Tensor, compute_dtype: torch.dtype,
                  out: torch.Tensor, gate_up, down, activation: ExpertActivation = SWIGLU) -> None:
    """out += weight[p] x down_p(act(gate_p, up_p)) for every pair p (act: the bank's `activation`,
    silu(gate) x up unless it says otherwise): `gate_up(x in the compute dtype)` gives each pair's
    gate and up rows times its token (float32 [P, I] each; no gate where the experts are not
    gated), `down(act, index)` each pair's down
    rows times act[index[p]]."""
    gate, up = gate_up(x.to(compute_dtype))
    act = activate(activation, gate, up)  # float32 [P, I]
    index = _pair_index(token.numel(), token.device)
    out.index_add_(0, token.long(), down(act, index) * weight.float()[:, None])


_PAIR_INDEX: dict[tuple[int, torch.device], torch.Tensor] = {}


def _pair_index(num_pairs: int, device: torch.device) -> torch.Tensor:
    index = _PAIR_INDEX.get((num_pairs, device))
    if index is None:
        index = _PAIR_INDEX[num_pairs, device] = torch.arange(num_pairs, dtype=torch.int32, device=device)
    return index


def fills_in_launch(layout: ExpertBank, x: torch.Tensor) -> bool:
    """Whether `add_slot_experts` can make the plan's PCIe fills in its own launch for this call:
    the kernel reads the layout in place, and the call is one token, whose pairs share a filled
    expert only where the routing repeats an id (each pair reads its expert itself)."""
    return (x.is_cuda and x.shape[0] == 1 and in_place_dtype(layout) is not None and not has_biases(layout)
            and _kernel() is not None)


def add_slot_experts(x: torch.Tensor, plan: RoutePlan, weights: torch.Tensor, slots: torch.Tensor,
                     views: RecordViews, compute_dtype: torch.dtype, out: torch.Tensor,
                     fill_bank: torch.Tensor | None = None, zero_out: bool = False) -> None:
    """out (float32 [T, H]) += the plan's device pairs, each expert read from its slot
    (`zero_out`: out = them, whatever it held). `fill_bank` (the layer's pinned host bank, where
    `fills_in_launch`): the plan's PCIe fills are made by the same launch, the misses read over
    PCIe while the hits compute."""
    if slots.shape[0] == 0:  # a cache of no slots (a budget with no room left): every pair is the CPU's
        if zero_out:
            out.zero_()
        return
    token, slot, weight = pairs_of(plan, weights)
    layout = views.layout
    dtype = in_place_dtype(layout)
    slot_experts = _kernel() if x.is_cuda and dtype is not None else None
    if fill_bank is not None and not fills_in_launch(layout, x):
        raise ValueError("add_slot_experts: this call's fills cannot be made in the launch (see fills_in_launch)")
    biases = pair_biases(slots, slot, layout) if has_biases(layout) else None
    if slot_experts is not None:
        parts = {p.name: p for p in layout.parts}
        hidden, inter = parts["w2"].shape
        activation = layout.activation
        slot_experts(x.to(compute_dtype), slots, token, slot, weight, w13_offset=parts["w13"].offset,
                     w2_offset=parts["w2"].offset, hidden=hidden, inter=inter, dtype=dtype, out=out,
                     fill_bank=fill_bank, pair_fill=plan.pair_fill if fill_bank is not None else None,
                     zero_out=zero_out, act=ACTIVATIONS[activation.kind], alpha=activation.alpha,
                     limit=activation.limit if activation.limit is not None else float("inf"),
                     pair_bias=biases[0] if biases is not None else None)
        if biases is not None:  # the down bias, weighted like the rest of the expert's output
            out.index_add_(0, token.long(), biases[1] * weight.float()[:, None])
        return
    block = triton_module("block_gemv") if x.is_cuda and dtype is None else None
    parts = block_parts(layout, block.KINDS, block.VALUES_PER_BLOCK) if block is not None else None
    fp8 = triton_module("fp8_gemv") if x.is_cuda and dtype is None and parts is None else None
    scaled = fp8_parts(layout, fp8.KINDS) if fp8 is not None else None
    if zero_out:
        out.zero_()
    if parts is not None:
        block_slot_experts(x, token, slot, weight, slots, parts, compute_dtype, out, block.block_gemv, layout.activation,
                           biases)
        return
    if scaled is not None:
        fp8_slot_experts(x, token, slot, weight, slots, scaled, views.block, compute_dtype, out, fp8.fp8_gemv,
                         layout.activation)
        return
    on_device = slot >= 0
    rows = slot.clamp(min=0).long()
    w13, w2 = views.weights(rows, compute_dtype)  # [P, 2I (or I), H], [P, H, I]
    y = swiglu_experts(x.to(compute_dtype)[token.long()].unsqueeze(1), w13, w2, layout.activation,
                       views.biases(rows, compute_dtype))[:, 0]  # [P, H]
    y = torch.where(on_device[:, None], y.to(torch.float32) * weight.float()[:, None], 0.0)  # never-filled slots: not even NaN
    out.index_add_(0, token.long(), y)
