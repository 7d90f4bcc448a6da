"""Triton kernels: decode-time SwiGLU experts read in place from expert-cache slots.

Semantics and arithmetic: slot_experts_ref.py (the torch twin this matches up to fp32 summation
order). Decode is memory bound (T <= ~32 tokens against 9 MB records), so this is two GEMV
passes over the weights with no gathered copy, where the gather + bmm path reads them three
times (gather read, gather write, bmm read):

1. grid (P, I / BLOCK_I, SPLIT): pair p's gate and up rows [i0, i0 + BLOCK_I) of W1 and W3
   against x[t] over one of SPLIT spans of H (fp32 partial sums kept 2-d, reduced across
   threads once); the span's sums of g and u into an fp32 scratch [SPLIT, P, 2, I].
2. grid (P, H / BLOCK_O, I / K_SPAN): rows [h0, h0 + BLOCK_O) of W2 over one span of I, against
   act = silu(g) * u made from the SPLIT partials (added in split order); atomic add of
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

In a step graph's PDL chain (dependent_launch.py) each pass starts its weight reads before it
waits for the launch before it. The gate pass looks its pair's expert up in the cache table
(`guess`) while the route plan still runs and computes its sums from that slot; after the wait
it keeps them only where the plan gave the pair that slot and no fill (a hit), so any table gives
the same result. The down pass launches once every gate-pass program has waited for the plan,
so it reads the plan and its first W2 tile (a fill's from the bank) during the gate pass, and
waits only for the partial sums. With `cast`, the down pass's last program writes the output
in the model's dtype (a counter of programs done), and the layer needs no cast launch.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from . import dependent_launch
from .slot_experts_ref import check_slot_experts_args


@triton.jit
def _read_from(slot_rows, fill, bank_addr, bank_stride, part_at, rows, ROW: tl.constexpr, FILL: tl.constexpr,
               ESIZE: tl.constexpr, BANK_ALIGN: tl.constexpr):
    """Where a pair's program reads its tile rows: `slot_rows` (rows of its slot's part), or for a
    pair filled in this launch (`fill`, its bank row, >= 0) the same rows of its record in the
    host bank (`part_at`: the part's element offset in a record). BANK_ALIGN: bytes that divide
    the bank's address, row stride and part offsets. Stated to the compiler, it keeps the tile
    loads 16-byte vectors: without it a load's source, slot or bank, has unknown alignment, and
    every pair's loads (hits too) were compiled 2 bytes at a time, which made a decode call 1.4x
    slower on the H200 (BENCHMARKS.md)."""
    source = slot_rows
    if FILL:
        if fill >= 0:
            record = bank_addr + fill.to(tl.int64) * bank_stride + part_at * ESIZE
            start = tl.multiple_of(record.to(tl.pointer_type(slot_rows.dtype.element_ty)), BANK_ALIGN)
            source = start + rows[:, None] * ROW
    return source


@triton.jit
def _pair_fill(fill_ptr, p, FILL: tl.constexpr):
    """Pair p's bank row to fill from (-1: none; a tensor either way, so that `fill >= 0` folds
    where FILL is off). Read past L1: the route plan wrote it in a launch that may still have been
    running when this program's kernel started (see `_down_kernel`)."""
    fill = tl.full([], -1, tl.int32)
    if FILL:
        fill = tl.load(fill_ptr + p, cache_modifier=".cg")
    return fill


@triton.jit
def _gate_up_sums(r1, w1, x_row, rows, cols, fill, HIDDEN: tl.constexpr, INTER: tl.constexpr,
                  BLOCK_I: tl.constexpr, BLOCK_H: tl.constexpr, H_SPAN: tl.constexpr, EVEN: tl.constexpr):
    """[BLOCK_I] sums of gate rows `rows` (W1 at r1, W3 INTER rows on) against x over this
    program's span of H; where `fill >= 0` every tile read is also stored at w1 (the slot)."""
    r3, w3 = r1 + INTER * HIDDEN, w1 + INTER * HIDDEN
    # 2-d partial sums, reduced across threads once after the tiles rather than every tile
    g = tl.zeros([BLOCK_I, BLOCK_H], dtype=tl.float32)
    u = tl.zeros([BLOCK_I, BLOCK_H], dtype=tl.float32)
    for c in tl.static_range(H_SPAN // BLOCK_H):  # unrolled: the tiles' loads are independent
        h = cols + c * BLOCK_H
        if EVEN:  # no masks: unpredicated 16-byte loads
            xs = tl.load(x_row + h)
            w1_tile = tl.load(r1 + h[None, :])
            w3_tile = tl.load(r3 + h[None, :])
            if fill >= 0:
                tl.store(w1 + h[None, :], w1_tile)
                tl.store(w3 + h[None, :], w3_tile)
        else:
            in_tile = (rows[:, None] < INTER) & (h < HIDDEN)[None, :]
            xs = tl.load(x_row + h, mask=h < HIDDEN, other=0.0)
            w1_tile = tl.load(r1 + h[None, :], mask=in_tile, other=0.0)
            w3_tile = tl.load(r3 + h[None, :], mask=in_tile, other=0.0)
            if fill >= 0:
                tl.store(w1 + h[None, :], w1_tile, mask=in_tile)
                tl.store(w3 + h[None, :], w3_tile, mask=in_tile)
        xs = xs.to(tl.float32)[None, :]  # [1, BLOCK_H]
        g += w1_tile.to(tl.float32) * xs
        u += w3_tile.to(tl.float32) * xs
    return tl.sum(g, axis=1), tl.sum(u, axis=1)


@triton.jit(do_not_specialize=["bank_addr", "bank_stride", "first_key"])
def _gate_up_kernel(
    x_ptr, stride_x, w_ptr, stride_slot, w13_at,
    token_ptr, slot_ptr, part_ptr, bank_addr, bank_stride, fill_ptr, out_ptr, stride_out, num_out, zero_chunk,
    expert_ptr, table_ptr, first_key, num_experts, count_ptr,
    HIDDEN: tl.constexpr, INTER: tl.constexpr, BLOCK_I: tl.constexpr, BLOCK_H: tl.constexpr, H_SPAN: tl.constexpr,
    EVEN: tl.constexpr, FILL: tl.constexpr, ESIZE: tl.constexpr, BANK_ALIGN: tl.constexpr, ZERO: tl.constexpr,
    BLOCK_Z: tl.constexpr, GUESS: tl.constexpr, COUNT: tl.constexpr, PDL: tl.constexpr,
):
    p, split = tl.program_id(0), tl.program_id(2)
    token = tl.load(token_ptr + p).to(tl.int64)  # fixed per shape: never written by the route plan
    rows = tl.program_id(1) * BLOCK_I + tl.arange(0, BLOCK_I)  # [BLOCK_I] rows of W1 (and of W3 at + INTER)
    cols = split * H_SPAN + tl.arange(0, BLOCK_H)  # this program's first tile of columns
    x_row = x_ptr + token * stride_x
    g = tl.zeros([BLOCK_I], dtype=tl.float32)
    u = tl.zeros([BLOCK_I], dtype=tl.float32)
    guess = tl.full([], -1, tl.int32)
    if GUESS:  # the slot the cache table holds for the pair's expert, read while the route plan may still run
        expert = tl.load(expert_ptr + p, cache_modifier=".cg")
        known = (expert >= 0) & (expert < num_experts)
        guess = tl.load(table_ptr + first_key + expert, mask=known, other=-1, cache_modifier=".cg")
        if guess >= 0:  # a hit: its sums now, over the plan's wait (checked against the plan below)
            w1_guess = w_ptr + guess.to(tl.int64) * stride_slot + w13_at + rows[:, None] * HIDDEN
            g, u = _gate_up_sums(w1_guess, w1_guess, x_row, rows, cols, tl.full([], -1, tl.int32), HIDDEN, INTER,
                                 BLOCK_I, BLOCK_H, H_SPAN, EVEN)
    if PDL:  # wait for the kernel before, then let the next one launch (dependent_launch.py)
        gdc_wait()
        gdc_launch_dependents()
    if ZERO:  # `out` starts at zero: pair 0's programs clear it in chunks (the down pass adds after this launch)
        if p == 0:
            chunk = tl.program_id(1) * tl.num_programs(2) + split
            at = chunk * zero_chunk + tl.arange(0, BLOCK_Z)
            keep = (at < (chunk + 1) * zero_chunk) & (at < num_out)
            tl.store(out_ptr + (at // HIDDEN) * stride_out + at % HIDDEN, tl.zeros([BLOCK_Z], tl.float32), mask=keep)
    if COUNT:  # the down pass's count of programs done starts at zero (its programs count after this launch)
        if (p == 0) & (tl.program_id(1) == 0) & (split == 0):
            tl.store(count_ptr, 0)
    slot = tl.load(slot_ptr + p)
    if slot < 0:
        return
    fill = _pair_fill(fill_ptr, p, FILL)
    w1 = w_ptr + slot.to(tl.int64) * stride_slot + w13_at + rows[:, None] * HIDDEN  # [BLOCK_I, 1]
    if (slot != guess) | (fill >= 0):  # no guess, a wrong one (a miss the plan was placing), or a fill
        r1 = _read_from(w1, fill, bank_addr, bank_stride, w13_at, rows, HIDDEN, FILL, ESIZE, BANK_ALIGN)
        g, u = _gate_up_sums(r1, w1, x_row, rows, cols, fill, HIDDEN, INTER, BLOCK_I, BLOCK_H, H_SPAN, EVEN)
    # this split's sums of the gate and up rows: partials [SPLIT, P, 2, I], added up by the down pass
    part = part_ptr + (split * tl.num_programs(0) + p) * (2 * INTER) + rows
    if EVEN:
        tl.store(part, g)
        tl.store(part + INTER, u)
    else:
        tl.store(part, g, mask=rows < INTER)
        tl.store(part + INTER, u, mask=rows < INTER)


@triton.jit(do_not_specialize=["bank_addr", "bank_stride"])
def _down_kernel(
    part_ptr, w_ptr, stride_slot, w2_at,
    token_ptr, slot_ptr, weight_ptr, out_ptr, stride_out, bank_addr, bank_stride, fill_ptr,
    count_ptr, cast_ptr, stride_cast, num_out,
    HIDDEN: tl.constexpr, INTER: tl.constexpr, BLOCK_O: tl.constexpr, BLOCK_K: tl.constexpr, K_SPAN: tl.constexpr,
    SPLIT: tl.constexpr, EVEN: tl.constexpr, FILL: tl.constexpr, ESIZE: tl.constexpr, BANK_ALIGN: tl.constexpr,
    CAST: tl.constexpr, BLOCK_C: tl.constexpr, PDL: tl.constexpr,
):
    # Before the wait: the pair's plan and its first tile of W2 (a fill's too: read from the bank and
    # stored in its slot), which need only the route plan. With PDL this kernel launches once every
    # gate-pass program has passed its own wait for the route plan, so the plan is written by then
    # (read past L1), and the down pass's weight reads overlap the gate pass's.
    p = tl.program_id(0)
    slot = tl.load(slot_ptr + p, cache_modifier=".cg")
    rows = tl.program_id(1) * BLOCK_O + tl.arange(0, BLOCK_O)  # [BLOCK_O] rows of W2 = output features
    cols = tl.program_id(2) * K_SPAN + tl.arange(0, BLOCK_K)  # this program's first tile of columns
    w2 = w_ptr + slot.to(tl.int64) * stride_slot + w2_at + rows[:, None] * INTER  # [BLOCK_O, 1]
    fill = tl.full([], -1, tl.int32)
    first = tl.zeros([BLOCK_O, BLOCK_K], dtype=w_ptr.dtype.element_ty)
    if slot >= 0:
        fill = _pair_fill(fill_ptr, p, FILL)
        r2 = _read_from(w2, fill, bank_addr, bank_stride, w2_at, rows, INTER, FILL, ESIZE, BANK_ALIGN)
        first = _w2_tile(r2, w2, rows, cols, fill, HIDDEN, INTER, EVEN)
    if PDL:  # the gate pass's partial sums from here on (a program never returns before its wait)
        gdc_wait()
        gdc_launch_dependents()
    if slot >= 0:
        token = tl.load(token_ptr + p).to(tl.int64)
        weight = tl.load(weight_ptr + p).to(tl.float32)
        r2 = _read_from(w2, fill, bank_addr, bank_stride, w2_at, rows, INTER, FILL, ESIZE, BANK_ALIGN)
        pair_part = part_ptr + p * (2 * INTER)
        split_stride = tl.num_programs(0) * (2 * INTER)
        y = tl.zeros([BLOCK_O, BLOCK_K], dtype=tl.float32)
        for c in tl.static_range(K_SPAN // BLOCK_K):
            i = cols + c * BLOCK_K
            if c == 0:
                w = first
            else:
                w = _w2_tile(r2, w2, rows, i, fill, HIDDEN, INTER, EVEN)
            g = tl.zeros([BLOCK_K], dtype=tl.float32)
            u = tl.zeros([BLOCK_K], dtype=tl.float32)
            for s in tl.static_range(SPLIT):  # the gate pass's partial sums, in split order
                g += tl.load(pair_part + s * split_stride + i, mask=i < INTER, other=0.0)
                u += tl.load(pair_part + s * split_stride + INTER + i, mask=i < INTER, other=0.0)
            act = g / (1.0 + tl.exp(-g)) * u  # silu(g) * u, fp32
            y += w.to(tl.float32) * act[None, :]
        y = tl.sum(y, axis=1) * weight  # [BLOCK_O]
        if EVEN:
            tl.atomic_add(out_ptr + token * stride_out + rows, y, sem="relaxed")
        else:
            tl.atomic_add(out_ptr + token * stride_out + rows, y, mask=rows < HIDDEN, sem="relaxed")
    if CAST:  # (skipped pairs' programs count too)
        _cast_when_last(count_ptr, out_ptr, stride_out, cast_ptr, stride_cast, num_out, HIDDEN, BLOCK_C)


@triton.jit
def _cast_when_last(count_ptr, out_ptr, stride_out, cast_ptr, stride_cast, num_out, HIDDEN: tl.constexpr,
                    BLOCK_C: tl.constexpr):
    """Count this program done (its adds into `out` made first); the program that counts last
    writes `out` cast to cast_ptr's dtype, so that no launch after this one has to."""
    tl.debug_barrier()  # every thread's adds issued before the count that releases them
    done = tl.atomic_add(count_ptr, 1, sem="acq_rel")
    if done == tl.num_programs(0) * tl.num_programs(1) * tl.num_programs(2) - 1:
        at = tl.arange(0, BLOCK_C)
        start = 0
        while start < num_out:
            idx = start + at
            keep = idx < num_out
            row, col = idx // HIDDEN, idx % HIDDEN
            total = tl.load(out_ptr + row * stride_out + col, mask=keep, other=0.0, cache_modifier=".cg")
            tl.store(cast_ptr + row * stride_cast + col, total.to(cast_ptr.dtype.element_ty), mask=keep)
            start += BLOCK_C


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
                 pair_fill: torch.Tensor | None = None, zero_out: bool = False,
                 guess: tuple[torch.Tensor, torch.Tensor, int, int] | None = None, cast: torch.Tensor | None = None,
                 block_i: int = 8, block_h: int = 512,
                 split_h: int = 4, block_o: int = 32, block_k: int = 256, split_k: int = 4,
                 num_warps: int = 4) -> None:
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

    `guess` (pair_expert [P] int32/int64, table int32, first_key, num_experts): where the slots
    come from a route plan launched just before on the same stream, its expert ids and the cache
    table it plans against (the layer's keys from first_key). A gate-pass program looks its
    pair's expert up in the table before it waits for the plan (PDL) and computes its sums from
    that slot meanwhile; after the wait it keeps them only where the plan gave the pair that slot
    and no fill, else it reads again. Any table gives the same result; the table the plan reads
    gives hits their reads ahead of the plan's end.

    `cast` ([T, H], unit inner stride, any float dtype): also `out` cast to it, written by the down
    pass's last program to finish (a captured decode step's layer output, with no launch of its own).

    Tiles: the gate pass reads [block_i, block_h] tiles of W1 and W3, its H split over at most
    `split_h` programs; the down pass [block_o, block_k] tiles of W2, its I over at most `split_k`
    programs (powers of two; benchmarks/bench_slot_experts.py --sweep times them). The defaults
    give each program one tile at Qwen3-30B's shape (H 2048, I 768).
    """
    w13_at, w2_at = check_slot_experts_args(x, slots, pair_token, pair_slot, pair_weight, w13_offset=w13_offset,
                                            w2_offset=w2_offset, hidden=hidden, inter=inter, dtype=dtype, out=out,
                                            fill_bank=fill_bank, pair_fill=pair_fill)
    if cast is not None and (cast.shape != out.shape or cast.stride(1) != 1 or not cast.is_floating_point()):
        raise ValueError(f"slot_experts: cast must be a float [T, H] like out with unit inner stride, got "
                         f"{cast.dtype} {tuple(cast.shape)} stride {cast.stride()}")
    num_pairs = pair_slot.numel()
    if num_pairs == 0 or slots.shape[0] == 0:
        if zero_out:
            out.zero_()
        if cast is not None:
            cast.copy_(out)
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
    if guess is not None:
        pair_expert, table, first_key, num_experts = guess
        if pair_expert.shape != (num_pairs,) or pair_expert.dtype not in (torch.int32, torch.int64) \
                or table.dtype != torch.int32 or table.dim() != 1 or not 0 <= first_key <= table.numel() - num_experts:
            raise ValueError(f"slot_experts: guess needs [P] int expert ids and an int32 table holding keys "
                             f"{first_key}..+{num_experts}, got {pair_expert.dtype} {tuple(pair_expert.shape)}, "
                             f"{table.dtype} {tuple(table.shape)}")
    else:  # placeholders the kernel never reads (GUESS is constexpr)
        pair_expert, table, first_key, num_experts = pair_slot, pair_slot, 0, 0
    count = torch.empty(1, dtype=torch.int32, device=x.device) if cast is not None else pair_slot  # (placeholder)
    esize = weights.element_size()
    bank_align = math.gcd(16, bank_addr, bank_stride, w13_offset, w2_offset) if fills else 16
    pdl = dependent_launch.enabled(x.device)
    up_blocks = triton.cdiv(inter, block_i)
    zero_chunk = triton.cdiv(out.numel(), up_blocks * splits)  # out's elements each of pair 0's programs clears
    _gate_up_kernel[(num_pairs, up_blocks, splits)](
        x, x.stride(0), weights, weights.stride(0), w13_at, pair_token, pair_slot, partials, bank_addr, bank_stride,
        fill_ptr, out, out.stride(0), out.numel(), zero_chunk, pair_expert, table, first_key, num_experts, count,
        HIDDEN=hidden, INTER=inter, BLOCK_I=block_i, BLOCK_H=block_h, H_SPAN=h_span,
        EVEN=hidden % h_span == 0 and inter % block_i == 0, FILL=fills, ESIZE=esize, BANK_ALIGN=bank_align,
        ZERO=zero_out, BLOCK_Z=triton.next_power_of_2(zero_chunk), GUESS=guess is not None, COUNT=cast is not None,
        PDL=pdl,
        num_warps=num_warps, launch_pdl=pdl,
    )
    _down_kernel[(num_pairs, triton.cdiv(hidden, block_o), triton.cdiv(inter, k_span))](
        partials, weights, weights.stride(0), w2_at, pair_token, pair_slot, pair_weight, out, out.stride(0),
        bank_addr, bank_stride, fill_ptr, count, cast if cast is not None else out,
        cast.stride(0) if cast is not None else 0, out.numel(), HIDDEN=hidden, INTER=inter, BLOCK_O=block_o,
        BLOCK_K=block_k, K_SPAN=k_span, SPLIT=splits, EVEN=hidden % block_o == 0 and inter % k_span == 0,
        FILL=fills, ESIZE=esize, BANK_ALIGN=bank_align, CAST=cast is not None,
        BLOCK_C=min(triton.next_power_of_2(out.numel()), 2048), PDL=pdl, num_warps=num_warps, launch_pdl=pdl,
    )
