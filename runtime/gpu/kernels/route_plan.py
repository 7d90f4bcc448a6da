"""Triton kernel that plans one MoE layer's expert work against the expert cache, on the device.

Semantics, tie-breaking and invariants: route_plan_ref.py (the torch twin this must match bit
for bit). The kernel is one program: N = T*K is at most a few dozen in decode, so dedup, hit
classification and the miss split are all-pairs [N, N] comparisons in registers; victim choice
is one pass over the S slots in blocks, keeping the best candidates in a register buffer.

Outputs have fixed shapes and `clock` / `n_pcie_max` may be device scalars, so a call can be
captured in a CUDA graph and replayed with a new clock and a new policy without recapture
(a Python int is baked into the graph at capture). Slots touched in this step by earlier
layers have last_used == clock and are never victims, so layers launched in order on one
stream see a consistent cache. The cache update is plain stores from the single program (all
addresses distinct), atomic as a whole to any later work on the stream; nothing else may write
the cache concurrently.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from . import dependent_launch
from .route_plan_ref import MAX_SLOTS, NUM_COUNTS, PINNED_TIME, SLOT_BITS, RoutePlan

_BIG = tl.constexpr(1 << 62)  # above every packed (last_used, slot) key: an empty buffer entry
_SLOT_SCALE = tl.constexpr(1 << SLOT_BITS)  # key = last_used * _SLOT_SCALE + slot
_SLOT_MASK = tl.constexpr((1 << SLOT_BITS) - 1)
_PINNED = tl.constexpr(PINNED_TIME)
_NUM_COUNTS = tl.constexpr(NUM_COUNTS)


@triton.jit(do_not_specialize=["n_ids", "layer", "num_experts", "num_slots", "clock_arg", "n_pcie_max_arg",
                               "n_table_last"])
def _route_plan_kernel(
    ids_ptr, n_ids, layer, num_experts,
    table_ptr, owner_ptr, last_used_ptr, num_slots,
    clock_arg, n_pcie_max_arg, n_table_last,
    unique_ptr, status_ptr, slot_ptr, evicted_ptr, counts_ptr, inverse_ptr, pair_slot_ptr, pair_fill_ptr, totals_ptr,
    CLOCK_ON_DEVICE: tl.constexpr, N_PCIE_MODE: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_R: tl.constexpr,
    ACCUMULATE: tl.constexpr, PDL: tl.constexpr,
):
    if PDL:  # wait for the kernel before, then let the next one launch (dependent_launch.py)
        gdc_wait()
        gdc_launch_dependents()
    # loads that need nothing computed here, issued first so that their latency overlaps the ids'
    # (the policy's table and the running sums would otherwise each add a round trip at the end)
    if N_PCIE_MODE == 2:
        table_at = tl.arange(0, BLOCK_T)
        n_pcie_table = tl.load(n_pcie_max_arg + table_at, mask=table_at <= n_table_last, other=0).to(tl.int32)
    if ACCUMULATE:
        sums_at = tl.arange(0, 8)
        sums = tl.load(totals_ptr + sums_at, mask=sums_at < _NUM_COUNTS, other=0)
    if CLOCK_ON_DEVICE == 2:  # a counter: moved on by one, the new value is this call's clock
        clock = tl.load(clock_arg).to(tl.int64) + 1
        tl.store(clock_arg, clock)
    elif CLOCK_ON_DEVICE == 1:
        clock = tl.load(clock_arg).to(tl.int64)
    else:
        clock = clock_arg.to(tl.int64)

    # --- dedup, first-occurrence order: rows index ids (or unique rows), columns ids
    offs = tl.arange(0, BLOCK_N)
    row = offs[:, None]
    col = offs[None, :]
    in_n = offs < n_ids
    ids = tl.load(ids_ptr + offs, mask=in_n, other=-1).to(tl.int32)
    same = (ids[:, None] == ids[None, :]) & in_n[:, None] & in_n[None, :]
    first = tl.min(tl.where(same, col, BLOCK_N), axis=1)  # [N] first position holding ids[i]
    is_first = in_n & (first == offs)
    inverse = tl.sum((is_first[None, :] & (col < first[:, None])).to(tl.int32), axis=1)  # [N]
    num_unique = tl.sum(is_first.to(tl.int32), axis=0)
    valid = offs < num_unique  # unique rows from here on
    uid = tl.sum(tl.where(is_first[None, :] & (inverse[None, :] == row), ids[None, :], 0), axis=1)
    uid = tl.where(valid, uid, -1)

    # --- hits and misses
    key = layer * num_experts + uid
    cached = tl.load(table_ptr + key, mask=valid, other=-1)
    hit = valid & (cached >= 0)
    miss = valid & (cached < 0)
    num_hits = tl.sum(hit.to(tl.int32), axis=0)
    num_miss = tl.sum(miss.to(tl.int32), axis=0)
    if N_PCIE_MODE == 2:  # a table indexed by the number of misses
        n_pcie_max = tl.sum(tl.where(table_at == tl.minimum(num_miss, n_table_last), n_pcie_table, 0), axis=0)
    elif N_PCIE_MODE == 1:
        n_pcie_max = tl.load(n_pcie_max_arg).to(tl.int32)
    else:
        n_pcie_max = n_pcie_max_arg.to(tl.int32)
    num_pcie_wanted = tl.minimum(num_miss, tl.maximum(n_pcie_max, 0))

    # --- the hits' LRU ranks, on sampled calls (route_plan_ref step 6), before any store below:
    # per block of BLOCK_R slots, the held ones and those used after each hit's slot
    sampled = ((((clock & 0xFFFF) * 40503) & 0xFFFF) >> 11) == 0
    hit_lu = tl.load(last_used_ptr + cached, mask=hit, other=0)
    newer = tl.zeros([BLOCK_N], tl.int32)
    num_held = tl.sum(tl.zeros([BLOCK_R], tl.int32), axis=0)
    rank_end = tl.where(sampled & (num_hits > 0), num_slots, 0)
    start = 0
    while start < rank_end:
        rank_at = start + tl.arange(0, BLOCK_R)
        lu = tl.load(last_used_ptr + rank_at, mask=rank_at < num_slots, other=-1)
        held = (lu >= 0) & (lu < _PINNED)
        num_held += tl.sum(held.to(tl.int32), axis=0)
        newer += tl.sum(((lu[None, :] > hit_lu[:, None]) & held[None, :]).to(tl.int32), axis=1)
        start += BLOCK_R
    num_ranked = tl.where(sampled, num_hits, 0)
    num_tail = tl.where(sampled, tl.sum((hit & (4 * newer >= 3 * num_held)).to(tl.int32), axis=0), 0)

    # --- victims: the num_pcie_wanted smallest keys (last_used, slot) over slots with last_used < clock
    # that no hit of this call holds, kept in an unsorted register buffer. Entries past the wanted
    # count hold -BIG, so the buffer's max is the admission threshold (-BIG: nothing is wanted, and
    # then the scan is skipped). Per block the candidates below the threshold enter smallest first,
    # each replacing the current max; a hit's slot is dropped when it comes up (rarely: hits are
    # recent), which is cheaper than comparing every slot with the hit list.
    buf = tl.where(offs < num_pcie_wanted, _BIG, -_BIG).to(tl.int64)
    scan_end = tl.where(num_pcie_wanted > 0, num_slots, 0)
    # while, not range: the interpreter's range() over a runtime bound fails with numpy >= 2.4
    start = 0
    while start < scan_end:
        slots = start + tl.arange(0, BLOCK_S)
        lu = tl.load(last_used_ptr + slots, mask=slots < num_slots, other=clock)
        cand = tl.where(lu < clock, lu * _SLOT_SCALE + slots, _BIG)
        best = tl.min(cand, axis=0)
        worst = tl.max(buf, axis=0)
        while best < worst:
            held = tl.sum(((cached == (best & _SLOT_MASK).to(tl.int32)) & hit).to(tl.int32), axis=0)
            at = tl.min(tl.where(buf == worst, offs, BLOCK_N), axis=0)
            buf = tl.where((offs == at) & (held == 0), best, buf)
            cand = tl.where(cand == best, _BIG, cand)
            best = tl.min(cand, axis=0)
            worst = tl.max(buf, axis=0)
        start += BLOCK_S

    good = (buf != _BIG) & (buf != -_BIG)
    buf_slot = (buf & _SLOT_MASK).to(tl.int32)
    rank = tl.sum((good[None, :] & (buf[None, :] < buf[:, None])).to(tl.int32), axis=1)  # among good
    num_pcie = tl.sum(good.to(tl.int32), axis=0)  # below num_pcie_wanted when too few slots are eligible
    miss_rank = tl.sum((miss[None, :] & (col < row)).to(tl.int32), axis=1)  # misses before row u
    pcie = miss & (miss_rank < num_pcie)
    victim = tl.sum(tl.where(good[None, :] & (rank[None, :] == miss_rank[:, None]), buf_slot[None, :], 0), axis=1)
    victim = tl.where(pcie, victim, -1)

    # --- writes: every address below is distinct (hit slots, victims, old keys, new keys)
    old = tl.load(owner_ptr + victim, mask=pcie, other=-1)
    tl.store(table_ptr + old, tl.full([BLOCK_N], -1, tl.int32), mask=pcie & (old >= 0))
    tl.store(owner_ptr + victim, key, mask=pcie)
    tl.store(table_ptr + key, victim, mask=pcie)
    slot = tl.where(hit, cached, victim)
    tl.store(last_used_ptr + slot, tl.zeros([BLOCK_N], tl.int64) + clock, mask=hit | pcie)

    status = tl.where(hit, 0, tl.where(pcie, 1, tl.where(miss, 2, -1)))
    tl.store(unique_ptr + offs, uid, mask=in_n)
    tl.store(status_ptr + offs, status, mask=in_n)
    tl.store(slot_ptr + offs, slot, mask=in_n)
    tl.store(evicted_ptr + offs, tl.where(pcie, old, -1), mask=in_n)
    tl.store(inverse_ptr + offs, inverse, mask=in_n)
    device_slot = tl.where(hit | pcie, slot, -1)  # per unique row; the CPU's rows hold -1
    pair_slot = tl.sum(tl.where(inverse[:, None] == col, device_slot[None, :], 0), axis=1)  # [N] by (t, k)
    tl.store(pair_slot_ptr + offs, pair_slot, mask=in_n)
    fill_row = tl.where(pcie, uid, -1)  # per unique row: the bank row a PCIe fill reads
    pair_fill = tl.sum(tl.where(inverse[:, None] == col, fill_row[None, :], 0), axis=1)
    tl.store(pair_fill_ptr + offs, pair_fill, mask=in_n)
    tl.store(counts_ptr + 0, num_hits)
    tl.store(counts_ptr + 1, num_pcie)
    tl.store(counts_ptr + 2, num_miss - num_pcie)
    tl.store(counts_ptr + 3, num_unique)
    tl.store(counts_ptr + 4, num_ranked)
    tl.store(counts_ptr + 5, num_tail)
    if ACCUMULATE:  # running sums (int64): launches on one stream run in order, so no atomics
        counts = tl.where(sums_at == 0, num_hits, tl.where(sums_at == 1, num_pcie, tl.where(
            sums_at == 2, num_miss - num_pcie, tl.where(sums_at == 3, num_unique, tl.where(
                sums_at == 4, num_ranked, num_tail)))))
        tl.store(totals_ptr + sums_at, sums + counts.to(tl.int64), mask=sums_at < _NUM_COUNTS)


def route_plan(expert_ids: torch.Tensor, layer: int, num_experts: int, table: torch.Tensor,
               owner: torch.Tensor, last_used: torch.Tensor, clock: int | torch.Tensor,
               n_pcie_max: int | torch.Tensor, *, out: RoutePlan | None = None, totals: torch.Tensor | None = None,
               block_slots: int = 4096, num_warps: int = 4, advance_clock: bool = False) -> RoutePlan:
    """Plan one layer on the device (semantics: route_plan_ref); updates table/owner/last_used in place.

    expert_ids [T, K] int32/int64; table int32 [L*E]; owner int32 [S]; last_used int64 [S];
    clock / n_pcie_max: Python ints or one-element device tensors (any int dtype; pass tensors
    to capture in a CUDA graph); `totals` (int64 [NUM_COUNTS], optional) gets the counts added; n_pcie_max may also be a device table [M] indexed by the
    layer's number of misses (clamped to M - 1): the policy's count for every miss count. `out`: a RoutePlan.empty(T, K, device) to fill (graph-static
    outputs); otherwise a new one. `advance_clock`: `clock` is an int64 counter [1] the kernel
    moves on by one and plans with (decode keeps the clock on the device: a captured call needs
    nothing written by the host). No host sync.

    Cost on an H200 (kernel time, T=1 K=8 S=3000): ~2 us when nothing goes over PCIe (no
    scan), ~5 us with misses; T=4 S=20000: ~10 us. block_slots 4096 / 4 warps measured best. In a
    step graph (benchmarks/bench_route_plan.py: 48 layers, 3208 slots, top-6, all hits) 1.98 us a
    call with a number for n_pcie_max, 2.05 with a split table: the table and the running sums are
    read at the start, beside the ids (2.22 and 2.36 us when each was a round trip at the end).
    """
    num_tokens, top_k = expert_ids.shape
    num_slots = owner.numel()
    if table.dtype != torch.int32 or owner.dtype != torch.int32 or last_used.dtype != torch.int64:
        raise TypeError("route_plan: table and owner must be int32, last_used int64")
    if last_used.numel() != num_slots or num_slots >= MAX_SLOTS:
        raise ValueError(f"route_plan: need len(last_used) == len(owner) < {MAX_SLOTS}, got "
                         f"{last_used.numel()} and {num_slots}")
    if layer < 0 or (layer + 1) * num_experts > table.numel():
        raise ValueError(f"route_plan: layer {layer} x {num_experts} experts is outside the table "
                         f"({table.numel()} keys)")
    if expert_ids.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"route_plan: expert_ids must be int32 or int64, got {expert_ids.dtype}")
    if totals is not None and (totals.dtype != torch.int64 or totals.numel() != NUM_COUNTS):
        raise TypeError(f"route_plan: totals must be int64 [{NUM_COUNTS}], got {totals.dtype} {list(totals.shape)}")
    plan = out if out is not None else RoutePlan.empty(num_tokens, top_k, expert_ids.device)
    n = num_tokens * top_k
    block_n = max(16, triton.next_power_of_2(n))
    block_s = max(16, min(block_slots, triton.next_power_of_2(num_slots)))
    clock_on_device = isinstance(clock, torch.Tensor)
    if advance_clock and (not clock_on_device or clock.dtype != torch.int64 or clock.numel() != 1):
        raise TypeError("route_plan: advance_clock needs the clock as an int64 tensor of one element")
    n_pcie_mode = 0 if not isinstance(n_pcie_max, torch.Tensor) else 1 if n_pcie_max.numel() == 1 else 2
    n_table_last = n_pcie_max.numel() - 1 if n_pcie_mode == 2 else 0
    pdl = dependent_launch.enabled(expert_ids.device)
    _route_plan_kernel[(1,)](
        expert_ids.contiguous(), n, layer, num_experts,
        table, owner, last_used, num_slots,
        clock, n_pcie_max, n_table_last,
        plan.unique_ids, plan.status, plan.slot, plan.evicted, plan.counts, plan.inverse, plan.pair_slot,
        plan.pair_fill,
        totals if totals is not None else plan.counts,
        CLOCK_ON_DEVICE=2 if advance_clock else int(clock_on_device), N_PCIE_MODE=n_pcie_mode,
        BLOCK_N=block_n, BLOCK_S=block_s, BLOCK_T=triton.next_power_of_2(n_table_last + 1),
        BLOCK_R=max(16, min(4096 // block_n, triton.next_power_of_2(num_slots))),
        ACCUMULATE=totals is not None, num_warps=num_warps, PDL=pdl,
        launch_pdl=pdl,
    )
    return plan
