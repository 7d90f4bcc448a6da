"""Triton kernels: decode-time SwiGLU experts read in place from expert-cache slots.

Semantics and arithmetic: slot_experts_ref.py (the torch twin this matches up to fp32 summation
order). Decode is memory bound (T <= ~32 tokens against 9 MB records), so this is two GEMV
passes over the weights with no gathered copy, where the gather + bmm path reads them three
times (gather read, gather write, bmm read):

1. grid (P, I / BLOCK_I, SPLIT): pair p's gate and up rows [i0, i0 + BLOCK_I) of W1 and W3
   against x[t] over one of SPLIT spans of H (fp32 partial sums kept 2-d, reduced across
   threads once); the span's sums of g and u into an fp32 scratch [SPLIT, P, 2, I].
2. grid (P, H / BLOCK_O, I / K_SPAN): rows [h0, h0 + BLOCK_O) of W2 over one span of I, against
   act = silu(g) * u made from the SPLIT partials (added in split order; the pair's gate|up bias
   added where given, the activation the bank's: ACT, see slot_experts_ref.py); atomic add of
   weight * y into out[t] (fp32; several pairs and spans share a token).

Every program's tiles are unrolled, their loads 16-byte vectors (BANK_ALIGN keeps them so on the
fill path), so all of a program's loads are in flight at once. On the H200 at Qwen3-30B's shape
(6 hits, 56.6 MB) a call takes 19.1-19.8 us across tilings (`bench_slot_experts.py --sweep`);
splitting I over the down pass's programs is worth ~0.7 us of that, H over the gate pass's ~0.

A skipped pair (slot -1) returns before loading anything. Shapes alone fix the grids, the
scratch comes from the caching allocator (a fixed address inside a CUDA graph's pool), and
nothing is read back to the host, so a call can be captured and replayed with new pairs.
Atomic adds make `out`'s last bits depend on the order pairs finish: not bitwise deterministic.

A pair reads its expert's weights once, so tokens sharing an expert (T > 1) read it once per
token; deduplicating those reads (one program over a slot's tokens) is the next step if T grows.

Fills in the same launch (`fill_bank`, `pair_fill`): a pair whose expert the route plan sent over
PCIe reads its weights from the pinned host bank (zero-copy, like kernels/expert_fill.py) and
stores every tile it reads into its slot, so the slot is whole when the launch ends. The misses'
PCIe reads then overlap the hits' compute instead of preceding it (a separate fill launch is
~200 us for a 9 MB record over the H200's link, during which the device did nothing else), and
a call without misses launches no fill at all. Each pair reads its own weights, so only a plan
whose PCIe experts each belong to one pair (T = 1) may fill here; others fill first.

In a step graph's PDL chain (dependent_launch.py) the down pass launches once every gate-pass
program has waited for the route plan, so it reads its pair's plan and its first W2 tile (a
fill's from the bank) before its own wait, during the gate pass, and waits only for the partial
sums: on the H200 ~2% off a layer with a PCIe miss (docs/benchmark-history.md). Two more overlaps measured
slower there and were taken out: the gate pass computing its hits from the slot the cache table
named while the plan still ran (the plan, one program, slowed under the load), and the down
pass's last program casting the output (a counter every program adds to).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from . import dependent_launch
from .slot_experts_ref import UNGATED_ACTS, check_slot_experts_args


@triton.jit
def _activation(g, u, alpha, limit, ACT: tl.constexpr):
    """act(g, u) in fp32 for an ACTIVATIONS code (slot_experts_ref.activation_ref)."""
    if ACT == 0:
        return g / (1.0 + tl.exp(-g)) * u
    if ACT == 4:  # relu2, not gated: relu(u)^2 (g is not read)
        r = tl.maximum(u, 0.0)
        return r * r
    if ACT == 5:  # silu, not gated: silu(u) (Doge's; g is not read)
        return u / (1.0 + tl.exp(-u))
    if ACT == 3:  # gelu's tanh form: 0.5 g (1 + tanh(z)) = g sigmoid(2 z)
        z = 0.7978845608028654 * (g + 0.044715 * g * g * g)
        return g / (1.0 + tl.exp(-2.0 * z)) * u
    g = tl.minimum(g, limit)
    u = tl.minimum(tl.maximum(u, -limit), limit)
    if ACT == 1:
        return g / (1.0 + tl.exp(-g)) * u
    return g / (1.0 + tl.exp(-alpha * g)) * (u + 1.0)


@triton.jit
def _read_from(slot_rows, fill, bank_addr, bank_stride, part_at, rows, ROW: tl.constexpr, FILL: tl.constexpr,
               ESIZE: tl.constexpr, BANK_ALIGN: tl.constexpr):
    """Where a pair's program reads its tile rows: `slot_rows` (rows of its slot's part), or for a
    pair filled in this launch (`fill`, its bank row, >= 0) the same rows of its record in the
    host bank (`part_at`: the part's element offset in a record). BANK_ALIGN: bytes that divide
    the bank's address, row stride and part offsets. Stated to the compiler, it keeps the tile
    loads 16-byte vectors: without it a load's source, slot or bank, has unknown alignment, and
    every pair's loads (hits too) were compiled 2 bytes at a time, which made a decode call 1.4x
    slower on the H200 (docs/benchmark-history.md)."""
    source = slot_rows
    if FILL:
        if fill >= 0:
            record = bank_addr + fill.to(tl.int64) * bank_stride + part_at * ESIZE
            start = tl.multiple_of(record.to(tl.pointer_type(slot_rows.dtype.element_ty)), BANK_ALIGN)
            source = start + rows[:, None] * ROW
    return source


@triton.jit(do_not_specialize=["bank_addr", "bank_stride"])
def _gate_up_kernel(
    x_ptr, stride_x, w_ptr, stride_slot, w13_at,
    token_ptr, slot_ptr, part_ptr, bank_addr, bank_stride, fill_ptr, out_ptr, stride_out, num_out, zero_chunk,
    HIDDEN: tl.constexpr, INTER: tl.constexpr, BLOCK_I: tl.constexpr, BLOCK_H: tl.constexpr, H_SPAN: tl.constexpr,
    EVEN: tl.constexpr, FILL: tl.constexpr, ESIZE: tl.constexpr, BANK_ALIGN: tl.constexpr, ZERO: tl.constexpr,
    BLOCK_Z: tl.constexpr, PDL: tl.constexpr, GATED: tl.constexpr,
):
    if PDL:  # wait for the kernel before, then let the next one launch (dependent_launch.py)
        gdc_wait()
        gdc_launch_dependents()
    p, split = tl.program_id(0), tl.program_id(2)
    if ZERO:  # `out` starts at zero: pair 0's programs clear it in chunks (the down pass adds after this launch)
        if p == 0:
            chunk = tl.program_id(1) * tl.num_programs(2) + split
            at = chunk * zero_chunk + tl.arange(0, BLOCK_Z)
            keep = (at < (chunk + 1) * zero_chunk) & (at < num_out)
            tl.store(out_ptr + (at // HIDDEN) * stride_out + at % HIDDEN, tl.zeros([BLOCK_Z], tl.float32), mask=keep)
    slot = tl.load(slot_ptr + p)
    if slot < 0:
        return
    token = tl.load(token_ptr + p).to(tl.int64)
    rows = tl.program_id(1) * BLOCK_I + tl.arange(0, BLOCK_I)  # [BLOCK_I] rows of W1 (and of W3 at + INTER)
    cols = split * H_SPAN + tl.arange(0, BLOCK_H)  # this program's first tile of columns
    w1 = w_ptr + slot.to(tl.int64) * stride_slot + w13_at + rows[:, None] * HIDDEN  # [BLOCK_I, 1]
    up_at = INTER * HIDDEN if GATED else 0  # (not gated: w13 is W3's rows alone, and W1 is not read)
    w3 = w1 + up_at
    fill = tl.full([], -1, tl.int32)  # a tensor either way: `fill >= 0` below folds when FILL is off
    if FILL:
        fill = tl.load(fill_ptr + p)
    r1 = _read_from(w1, fill, bank_addr, bank_stride, w13_at, rows, HIDDEN, FILL, ESIZE, BANK_ALIGN)
    r3 = r1 + up_at
    x_row = x_ptr + token * stride_x
    # 2-d partial sums, reduced across threads once after the tiles rather than every tile
    g = tl.zeros([BLOCK_I, BLOCK_H], dtype=tl.float32)
    u = tl.zeros([BLOCK_I, BLOCK_H], dtype=tl.float32)
    for c in tl.static_range(H_SPAN // BLOCK_H):  # unrolled: the tiles' loads are independent
        h = cols + c * BLOCK_H
        if EVEN:  # no masks: unpredicated 16-byte loads
            xs = tl.load(x_row + h)
            w3_tile = tl.load(r3 + h[None, :])
            if fill >= 0:
                tl.store(w3 + h[None, :], w3_tile)
            if GATED:
                w1_tile = tl.load(r1 + h[None, :])
                if fill >= 0:
                    tl.store(w1 + h[None, :], w1_tile)
        else:
            in_tile = (rows[:, None] < INTER) & (h < HIDDEN)[None, :]
            xs = tl.load(x_row + h, mask=h < HIDDEN, other=0.0)
            w3_tile = tl.load(r3 + h[None, :], mask=in_tile, other=0.0)
            if fill >= 0:
                tl.store(w3 + h[None, :], w3_tile, mask=in_tile)
            if GATED:
                w1_tile = tl.load(r1 + h[None, :], mask=in_tile, other=0.0)
                if fill >= 0:
                    tl.store(w1 + h[None, :], w1_tile, mask=in_tile)
        xs = xs.to(tl.float32)[None, :]  # [1, BLOCK_H]
        if GATED:
            g += w1_tile.to(tl.float32) * xs
        u += w3_tile.to(tl.float32) * xs
    # this split's sums of the gate and up rows: partials [SPLIT, P, 2, I], added up by the down pass
    part = part_ptr + (split * tl.num_programs(0) + p) * (2 * INTER) + rows
    if EVEN:
        tl.store(part, tl.sum(g, axis=1))
        tl.store(part + INTER, tl.sum(u, axis=1))
    else:
        tl.store(part, tl.sum(g, axis=1), mask=rows < INTER)
        tl.store(part + INTER, tl.sum(u, axis=1), mask=rows < INTER)


@triton.jit(do_not_specialize=["bank_addr", "bank_stride"])
def _down_kernel(
    part_ptr, w_ptr, stride_slot, w2_at,
    token_ptr, slot_ptr, weight_ptr, out_ptr, stride_out, bank_addr, bank_stride, fill_ptr, bias_ptr, alpha, limit,
    HIDDEN: tl.constexpr, INTER: tl.constexpr, BLOCK_O: tl.constexpr, BLOCK_K: tl.constexpr, K_SPAN: tl.constexpr,
    SPLIT: tl.constexpr, EVEN: tl.constexpr, FILL: tl.constexpr, ESIZE: tl.constexpr, BANK_ALIGN: tl.constexpr,
    EARLY: tl.constexpr, PDL: tl.constexpr, ACT: tl.constexpr, BIAS: tl.constexpr,
):
    p = tl.program_id(0)
    rows = tl.program_id(1) * BLOCK_O + tl.arange(0, BLOCK_O)  # [BLOCK_O] rows of W2 = output features
    cols = tl.program_id(2) * K_SPAN + tl.arange(0, BLOCK_K)  # this program's first tile of columns
    if EARLY:
        # Before the wait (PDL): the pair's plan and its first tile of W2 (a fill's too: read from the
        # bank and stored in its slot), which need only the route plan. This kernel launches once
        # every gate-pass program has passed its own wait for the plan, so the plan's grid has
        # completed by then and its stores are in L2, read here past L1 (.cg): griddepcontrol.wait
        # itself promises visibility only of the grid just before. The down pass's weight reads
        # then overlap the gate pass's, which touches no slot's W2 part.
        slot = tl.load(slot_ptr + p, cache_modifier=".cg")
        fill = tl.full([], -1, tl.int32)
        first = tl.zeros([BLOCK_O, BLOCK_K], dtype=w_ptr.dtype.element_ty)
        if slot >= 0:
            w2 = w_ptr + slot.to(tl.int64) * stride_slot + w2_at + rows[:, None] * INTER
            if FILL:
                fill = tl.load(fill_ptr + p, cache_modifier=".cg")
            r2 = _read_from(w2, fill, bank_addr, bank_stride, w2_at, rows, INTER, FILL, ESIZE, BANK_ALIGN)
            first = _w2_tile(r2, w2, rows, cols, fill, HIDDEN, INTER, EVEN)
    else:
        slot = tl.load(slot_ptr + p)
    if PDL:  # the gate pass's partial sums from here on (a program never returns before its wait)
        gdc_wait()
        gdc_launch_dependents()
    if slot < 0:
        return
    token = tl.load(token_ptr + p).to(tl.int64)
    weight = tl.load(weight_ptr + p).to(tl.float32)
    w2 = w_ptr + slot.to(tl.int64) * stride_slot + w2_at + rows[:, None] * INTER  # [BLOCK_O, 1]
    if not EARLY:
        fill = tl.full([], -1, tl.int32)  # a tensor either way: `fill >= 0` folds when FILL is off
        if FILL:
            fill = tl.load(fill_ptr + p)
    r2 = _read_from(w2, fill, bank_addr, bank_stride, w2_at, rows, INTER, FILL, ESIZE, BANK_ALIGN)
    pair_part = part_ptr + p * (2 * INTER)
    split_stride = tl.num_programs(0) * (2 * INTER)
    y = tl.zeros([BLOCK_O, BLOCK_K], dtype=tl.float32)
    for c in tl.static_range(K_SPAN // BLOCK_K):
        i = cols + c * BLOCK_K
        if EARLY and c == 0:
            w = first
        else:
            w = _w2_tile(r2, w2, rows, i, fill, HIDDEN, INTER, EVEN)
        g = tl.zeros([BLOCK_K], dtype=tl.float32)
        u = tl.zeros([BLOCK_K], dtype=tl.float32)
        for s in tl.static_range(SPLIT):  # the gate pass's partial sums, in split order
            if ACT != 4 and ACT != 5:  # (relu2 and silu are not gated: no gate sums)
                g += tl.load(pair_part + s * split_stride + i, mask=i < INTER, other=0.0)
            u += tl.load(pair_part + s * split_stride + INTER + i, mask=i < INTER, other=0.0)
        if BIAS:  # the pair's gate and up biases [2I] ([I], up's, where not gated), fp32
            if ACT != 4 and ACT != 5:
                g += tl.load(bias_ptr + p * (2 * INTER) + i, mask=i < INTER, other=0.0)
                u += tl.load(bias_ptr + p * (2 * INTER) + INTER + i, mask=i < INTER, other=0.0)
            else:
                u += tl.load(bias_ptr + p * INTER + i, mask=i < INTER, other=0.0)
        act = _activation(g, u, alpha, limit, ACT)  # silu(g) * u for plain SwiGLU, fp32
        y += w.to(tl.float32) * act[None, :]
    y = tl.sum(y, axis=1) * weight  # [BLOCK_O]
    if EVEN:
        tl.atomic_add(out_ptr + token * stride_out + rows, y, sem="relaxed")
    else:
        tl.atomic_add(out_ptr + token * stride_out + rows, y, mask=rows < HIDDEN, sem="relaxed")


@triton.jit
def _w2_tile(r2, w2, rows, i, fill, HIDDEN: tl.constexpr, INTER: tl.constexpr, EVEN: tl.constexpr):
    """The [BLOCK_O, BLOCK_K] tile of W2 at columns `i`, read from r2; where `fill >= 0` also
    stored at w2 (the slot)."""
    if EVEN:
        w = tl.load(r2 + i[None, :])
        if fill >= 0:
            tl.store(w2 + i[None, :], w)
    else:
        in_tile = (rows[:, None] < HIDDEN) & (i < INTER)[None, :]
        w = tl.load(r2 + i[None, :], mask=in_tile, other=0.0)
        if fill >= 0:
            tl.store(w2 + i[None, :], w, mask=in_tile)
    return w


def _span(length: int, splits: int, block: int) -> int:
    """Columns one program reduces: `length` over at most `splits` programs, in whole blocks."""
    return triton.cdiv(triton.cdiv(length, splits), block) * block


def slot_experts(x: torch.Tensor, slots: torch.Tensor, pair_token: torch.Tensor, pair_slot: torch.Tensor,
                 pair_weight: torch.Tensor, *, w13_offset: int, w2_offset: int, hidden: int, inter: int,
                 dtype: torch.dtype, out: torch.Tensor, fill_bank: torch.Tensor | None = None,
                 pair_fill: torch.Tensor | None = None, zero_out: bool = False, block_i: int = 8, block_h: int = 512,
                 split_h: int = 4, block_o: int = 32, block_k: int = 256, split_k: int = 4,
                 num_warps: int = 4, early_reads: bool | None = None, act: int = 0, alpha: float = 1.0,
                 limit: float = float("inf"), pair_bias: torch.Tensor | None = None) -> None:
    """out[t] += sum over pairs p with pair_token[p] == t and pair_slot[p] >= 0 of pair_weight[p] *
    expert_{pair_slot[p]}(x[t]), the expert's weights read in place from slot pair_slot[p].

    x [T, H] float (bf16/f16) and out [T, H] float32 with unit inner stride; slots uint8
    [S, slot_bytes]; pair_token / pair_slot int32 [P], pair_weight [P] (any float dtype: read as fp32), all on one device.
    w13_offset / w2_offset: byte offsets of the parts in a record, multiples of dtype's size;
    hidden, inter: H and I; dtype: the parts' dtype (bf16 or f16). No host sync; pair_token must
    be in [0, T) for every pair that is not skipped (not checked: that would need a sync).

    `fill_bank` (uint8 [E, stride], page-locked host memory on CUDA) with `pair_fill` (int32 [P],
    RoutePlan.pair_fill): pairs with pair_fill[p] = e >= 0 read expert e's parts from the bank and
    leave them in slot pair_slot[p] (the fill and the compute in one launch). Pairs that share a
    filled expert (a duplicate id) each read it over PCIe and store the same bytes: right, but
    the record crosses twice, which is why calls of several tokens fill first.

    `zero_out`: out = the sum, not out += it (the first launch clears `out`: no separate fill of
    zeros, one node fewer in a captured decode call).

    Tiles: the gate pass reads [block_i, block_h] tiles of W1 and W3, its H split over at most
    `split_h` programs; the down pass [block_o, block_k] tiles of W2, its I over at most `split_k`
    programs (powers of two; benchmarks/bench_slot_experts.py --sweep times them). The defaults
    give each program one tile at Qwen3-30B's shape (H 2048, I 768).

    `early_reads`: the down pass reads its pair's plan and first W2 tile before it waits for the
    gate pass; by default where the launches use PDL (a step graph), the only place the reads
    can overlap the gate pass (the tests also set it under the interpreter).

    `act` (an ACTIVATIONS code, with `alpha` and `limit`) and `pair_bias` (float32 [P, 2I], the
    pairs' gate and up biases, gathered before the launch: not with fills): the bank's own expert
    form, as slot_experts_ref.py says (relu2, code 4, not gated: w13 is the up rows alone, [I, H],
    and `pair_bias` [P, I]). The down bias is the caller's to add.
    """
    w13_at, w2_at = check_slot_experts_args(x, slots, pair_token, pair_slot, pair_weight, w13_offset=w13_offset,
                                            w2_offset=w2_offset, hidden=hidden, inter=inter, dtype=dtype, out=out,
                                            fill_bank=fill_bank, pair_fill=pair_fill, act=act, pair_bias=pair_bias)
    num_pairs = pair_slot.numel()
    if num_pairs == 0 or slots.shape[0] == 0:
        if zero_out:
            out.zero_()
        return
    weights = slots.view(dtype)  # [S, slot_bytes / esize]: element pointers into the records
    block_i = min(block_i, triton.next_power_of_2(inter))
    block_h = min(block_h, triton.next_power_of_2(hidden))
    block_o = min(block_o, triton.next_power_of_2(hidden))
    block_k = min(block_k, triton.next_power_of_2(inter))
    h_span, k_span = _span(hidden, split_h, block_h), _span(inter, split_k, block_k)
    splits = triton.cdiv(hidden, h_span)
    partials = torch.empty(splits, num_pairs, 2, inter, dtype=torch.float32, device=x.device)  # g and u sums
    fills = fill_bank is not None
    # without fills the bank arguments are placeholders the kernels never read (FILL is constexpr)
    bank_addr, bank_stride = (fill_bank.data_ptr(), fill_bank.stride(0)) if fills else (0, 0)
    fill_ptr = pair_fill if fills else pair_slot
    esize = weights.element_size()
    bank_align = math.gcd(16, bank_addr, bank_stride, w13_offset, w2_offset) if fills else 16
    pdl = dependent_launch.enabled(x.device)
    up_blocks = triton.cdiv(inter, block_i)
    zero_chunk = triton.cdiv(out.numel(), up_blocks * splits)  # out's elements each of pair 0's programs clears
    _gate_up_kernel[(num_pairs, up_blocks, splits)](
        x, x.stride(0), weights, weights.stride(0), w13_at, pair_token, pair_slot, partials, bank_addr, bank_stride,
        fill_ptr, out, out.stride(0), out.numel(), zero_chunk, HIDDEN=hidden, INTER=inter, BLOCK_I=block_i,
        BLOCK_H=block_h, H_SPAN=h_span, EVEN=hidden % h_span == 0 and inter % block_i == 0, FILL=fills,
        ESIZE=esize, BANK_ALIGN=bank_align, ZERO=zero_out, BLOCK_Z=triton.next_power_of_2(zero_chunk), PDL=pdl,
        GATED=act not in UNGATED_ACTS, num_warps=num_warps, launch_pdl=pdl,
    )
    _down_kernel[(num_pairs, triton.cdiv(hidden, block_o), triton.cdiv(inter, k_span))](
        partials, weights, weights.stride(0), w2_at, pair_token, pair_slot, pair_weight, out, out.stride(0),
        bank_addr, bank_stride, fill_ptr, pair_bias if pair_bias is not None else partials, float(alpha),
        float(min(limit, 3.0e38)), HIDDEN=hidden, INTER=inter, BLOCK_O=block_o, BLOCK_K=block_k,
        K_SPAN=k_span, SPLIT=splits, EVEN=hidden % block_o == 0 and inter % k_span == 0, FILL=fills, ESIZE=esize,
        BANK_ALIGN=bank_align, EARLY=pdl if early_reads is None else early_reads, PDL=pdl, ACT=act,
        BIAS=pair_bias is not None, num_warps=num_warps, launch_pdl=pdl,
    )
