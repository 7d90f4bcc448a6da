"""Decode-time SwiGLU experts read in place from expert-cache slots: the torch twin (the spec).

`slot_experts` (slot_experts.py, Triton) must match this up to fp32 summation order. Both read
each pair's weights straight from its slot's record bytes (the FTW layout: `w13` [2I, H], gate
rows W1 first, then up rows W3; `w2` [H, I]), so the caller never gathers a copy of them.

Arithmetic, exactly (both files): x and the weights are upcast to fp32, every product and sum
is fp32, and nothing is rounded in between:

    g = x[t] @ W1^T, u = x[t] @ W3^T            # [I], fp32 (+ the pair's gate|up bias, where given)
    act = silu(g) * u                           # [I], fp32 (not rounded to `dtype`)
    out[t] += weight * (act @ W2^T)             # [H], fp32

`act` is the bank's activation (`ACTIVATIONS`: "swiglu" as above; "swiglu_limited", DeepSeek-V4's,
with g clamped to at most `limit` and u to [-limit, limit] first; "swiglu_clamped", gpt-oss's,
g * sigmoid(alpha * g) * (u + 1) on the same clamps; "geglu_tanh", Gemma 4's, gelu(g) * u by GELU's tanh
approximation; "relu2", Nemotron-H's, not gated: relu(u)^2, the record's `w13` [I, H] its up rows
alone, no g). `pair_bias` float32 [P, 2I] ([P, I] not gated): the gate and up
biases of each pair's expert, gathered by the caller (the down bias it adds itself, outside).

Products of two bf16 (or two f16) values are exact in fp32, so the two twins differ only by the
order of the fp32 sums (and the order of the atomic adds into `out`): |diff| stays around
1e-6 * |out|. The gather + bmm path (`records.experts_from_records` in bf16) rounds g, u, act,
the expert output and the weighted output to `dtype`; against it expect bf16-level differences
(~1% of max|out|), and this path is the more accurate one.

This twin gathers the pairs' weights (it is the specification and a CPU fallback, not the fast
path); like the kernel it needs no host sync, so it can also be captured in a CUDA graph.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

WEIGHT_DTYPES = (torch.bfloat16, torch.float16)
# the kernels' ACT codes
ACTIVATIONS = {"swiglu": 0, "swiglu_limited": 1, "swiglu_clamped": 2, "geglu_tanh": 3, "relu2": 4, "silu": 5}
UNGATED_ACTS = (4, 5)  # the codes whose w13 is the up rows alone [I, H]


def w13_rows(act: int, inter: int) -> int:
    """The rows of a record's w13 for ACT code `act`."""
    return inter if act in UNGATED_ACTS else 2 * inter


def activation_ref(g: torch.Tensor | None, u: torch.Tensor, act: int, alpha: float, limit: float) -> torch.Tensor:
    """act(g, u) in fp32 for an ACTIVATIONS code (runtime/experts/activation.py's formulas; g None
    for a code that is not gated)."""
    if act == 4:
        return F.relu(u).square()
    if act == 5:
        return F.silu(u)
    assert g is not None
    if act == 0:
        return F.silu(g) * u
    if act == 3:
        return F.gelu(g, approximate="tanh") * u
    g, u = g.clamp(max=limit), u.clamp(min=-limit, max=limit)
    return F.silu(g) * u if act == 1 else g * torch.sigmoid(alpha * g) * (u + 1)


def check_slot_experts_args(x: torch.Tensor, slots: torch.Tensor, pair_token: torch.Tensor,
                            pair_slot: torch.Tensor, pair_weight: torch.Tensor, *, w13_offset: int,
                            w2_offset: int, hidden: int, inter: int, dtype: torch.dtype,
                            out: torch.Tensor, fill_bank: torch.Tensor | None = None,
                            pair_fill: torch.Tensor | None = None, act: int = 0,
                            pair_bias: torch.Tensor | None = None) -> tuple[int, int]:
    """Raise TypeError / ValueError on arguments the kernel cannot take (shapes, dtypes, offsets);
    returns the element offsets (w13, w2) inside a record. Reads shapes only: no host sync."""
    if dtype not in WEIGHT_DTYPES:
        raise TypeError(f"slot_experts: weights must be bf16 or f16, not {dtype}")
    if slots.dtype != torch.uint8 or slots.dim() != 2 or slots.stride(1) != 1:
        raise TypeError(f"slot_experts: slots must be uint8 [S, slot_bytes] with unit inner stride, got "
                        f"{slots.dtype} {tuple(slots.shape)} stride {slots.stride()}")
    if pair_token.dtype != torch.int32 or pair_slot.dtype != torch.int32 or not pair_weight.is_floating_point():
        raise TypeError(f"slot_experts: pair_token/pair_slot must be int32 and pair_weight float, got "
                        f"{pair_token.dtype}/{pair_slot.dtype}/{pair_weight.dtype}")
    num_pairs = pair_token.numel()
    if pair_token.dim() != 1 or pair_slot.shape != (num_pairs,) or pair_weight.shape != (num_pairs,):
        raise ValueError(f"slot_experts: pair_token, pair_slot, pair_weight must all be [P], got "
                         f"{tuple(pair_token.shape)}, {tuple(pair_slot.shape)}, {tuple(pair_weight.shape)}")
    if not x.is_floating_point() or out.dtype != torch.float32:
        raise TypeError(f"slot_experts: x must be a float tensor and out float32, got {x.dtype} and {out.dtype}")
    if x.dim() != 2 or x.shape[1] != hidden or out.shape != x.shape or x.stride(1) != 1 or out.stride(1) != 1:
        raise ValueError(f"slot_experts: x and out must be [T, {hidden}] with unit inner stride, got "
                         f"{tuple(x.shape)} stride {x.stride()} and {tuple(out.shape)} stride {out.stride()}")
    esize = torch.empty(0, dtype=dtype).element_size()
    slot_bytes = slots.shape[1]
    rows = w13_rows(act, inter)
    for name, offset, nbytes in (("w13", w13_offset, rows * hidden * esize), ("w2", w2_offset, hidden * inter * esize)):
        if offset < 0 or offset % esize or offset + nbytes > slot_bytes:
            raise ValueError(f"slot_experts: {name} at byte {offset} ({nbytes} bytes) is not an aligned part "
                             f"of a {slot_bytes}-byte slot")
    if slots.stride(0) % esize:
        raise ValueError(f"slot_experts: slot stride {slots.stride(0)} bytes is not a multiple of {esize}")
    if act not in ACTIVATIONS.values():
        raise ValueError(f"slot_experts: act is an ACTIVATIONS code ({sorted(ACTIVATIONS.values())}), not {act}")
    if pair_bias is not None and (pair_bias.dtype != torch.float32 or pair_bias.shape != (num_pairs, rows)
                                  or not pair_bias.is_contiguous()):
        raise TypeError(f"slot_experts: pair_bias must be contiguous float32 [P, w13 rows] = [{num_pairs}, {rows}], got "
                        f"{pair_bias.dtype} {tuple(pair_bias.shape)}")
    if pair_bias is not None and fill_bank is not None:
        raise ValueError("slot_experts: pair_bias is gathered from the slots before the launch, so fills go first")
    if (fill_bank is None) != (pair_fill is None):
        raise ValueError("slot_experts: fill_bank and pair_fill come together (fills in the launch) or not at all")
    if fill_bank is not None:
        if fill_bank.dtype != torch.uint8 or fill_bank.dim() != 2 or not fill_bank.is_contiguous():
            raise TypeError(f"slot_experts: fill_bank must be a contiguous uint8 [E, stride] bank, got "
                            f"{fill_bank.dtype} {tuple(fill_bank.shape)}")
        ends = max(w13_offset + rows * hidden * esize, w2_offset + hidden * inter * esize)
        if fill_bank.shape[1] < ends or fill_bank.stride(0) % esize:
            raise ValueError(f"slot_experts: fill_bank records of {fill_bank.shape[1]} bytes do not hold the parts "
                             f"(up to byte {ends}, aligned to {esize})")
        if pair_fill.dtype != torch.int32 or pair_fill.shape != (num_pairs,):
            raise TypeError(f"slot_experts: pair_fill must be int32 [P], got {pair_fill.dtype} {tuple(pair_fill.shape)}")
    return w13_offset // esize, w2_offset // esize


def slot_weights(slots: torch.Tensor, offset_elems: int, shape: tuple[int, int], dtype: torch.dtype) -> torch.Tensor:
    """The part at element `offset_elems` of every slot, read in place: [S, *shape] in `dtype`."""
    flat = slots.view(dtype)  # [S, slot_bytes / esize]
    return flat[:, offset_elems : offset_elems + shape[0] * shape[1]].unflatten(1, shape)


def slot_experts_ref(x: torch.Tensor, slots: torch.Tensor, pair_token: torch.Tensor, pair_slot: torch.Tensor,
                     pair_weight: torch.Tensor, *, w13_offset: int, w2_offset: int, hidden: int, inter: int,
                     dtype: torch.dtype, out: torch.Tensor, fill_bank: torch.Tensor | None = None,
                     pair_fill: torch.Tensor | None = None, zero_out: bool = False, act: int = 0,
                     alpha: float = 1.0, limit: float = float("inf"), pair_bias: torch.Tensor | None = None) -> None:
    """out[t] += sum over pairs p with pair_token[p] == t and pair_slot[p] >= 0 of pair_weight[p] *
    expert_{pair_slot[p]}(x[t]); arithmetic in the module docstring (`act`, `alpha`, `limit`,
    `pair_bias` there too). Skipped pairs (slot -1) read
    nothing that matters: their token and weight may hold anything.

    With `fill_bank` and `pair_fill`: first, for every pair with pair_fill[p] = e >= 0, the w13
    and w2 parts of bank row e are copied into slot pair_slot[p] (read on the host: a sync).
    `zero_out`: out = the sum instead of out += it."""
    w13_at, w2_at = check_slot_experts_args(x, slots, pair_token, pair_slot, pair_weight, w13_offset=w13_offset,
                                            w2_offset=w2_offset, hidden=hidden, inter=inter, dtype=dtype, out=out,
                                            fill_bank=fill_bank, pair_fill=pair_fill, act=act, pair_bias=pair_bias)
    if zero_out:
        out.zero_()
    if pair_slot.numel() == 0 or slots.shape[0] == 0:
        return
    if fill_bank is not None:
        esize = torch.empty(0, dtype=dtype).element_size()
        parts = ((w13_offset, w13_rows(act, inter) * hidden * esize), (w2_offset, hidden * inter * esize))
        for slot, expert in zip(pair_slot.tolist(), pair_fill.tolist(), strict=True):
            if expert >= 0 and slot >= 0:
                for offset, nbytes in parts:
                    slots[slot, offset: offset + nbytes].copy_(fill_bank[expert, offset: offset + nbytes],
                                                                non_blocking=True)
    used = pair_slot >= 0  # [P]
    slot = torch.where(used, pair_slot, 0).long()
    token = torch.where(used, pair_token, 0).long()
    w13 = slot_weights(slots, w13_at, (w13_rows(act, inter), hidden), dtype)[slot].float()  # [P, 2I (or I), H]
    w2 = slot_weights(slots, w2_at, (hidden, inter), dtype)[slot].float()  # [P, H, I]
    xs = x[token].float()  # [P, H]
    h = torch.einsum("ph,pjh->pj", xs, w13)  # [P, 2I]
    if pair_bias is not None:
        h = h + pair_bias.float()
    gate = None if act in UNGATED_ACTS else h[:, :inter]
    a = activation_ref(gate, h[:, -inter:], act, alpha, limit)  # [P, I]
    y = torch.einsum("pi,phi->ph", a, w2) * pair_weight.float()[:, None]  # [P, H]
    out.index_add_(0, token, torch.where(used[:, None], y, 0.0))  # where, not a 0 weight: a skipped slot may hold NaNs
