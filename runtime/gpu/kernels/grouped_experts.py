"""Triton kernels: a prompt chunk's SwiGLU experts as two grouped GEMMs over records read in place.

A prefill call routes a chunk of tokens (512 on the GPU path) to nearly every expert of a layer,
and its experts' records sit side by side in a streamed bank or in cache slots. Computed expert by
expert, or in padded runs of experts (records.experts_from_records), a chunk costs a few hundred
kernel launches for ~0.3 ms of device work: on the H200 a 4k-token prompt was bound by the host's
launches, not by PCIe (docs/benchmark-history.md). Here the whole call is two launches:

1. `_gate_up_kernel`, grid (experts, M tiles, I / BLOCK_N): expert e's pairs (sorted by record
   row, as PairPlan sorts them: e's are pairs[starts[e] : starts[e] + counts[e]]) in tiles of
   BLOCK_M, each tile's tokens gathered from x, against the gate and up rows [n0, n0 + BLOCK_N) of
   the record's W13 over all of H: act = silu(x W1^T) * (x W3^T), fp32 accumulators, stored in
   the compute dtype at the pairs' sorted positions.
2. `_down_kernel`, grid (experts, M tiles, H / BLOCK_N): act against W2's rows [h0, h0 + BLOCK_N)
   over I, times each pair's routing weight, added atomically into the fp32 output rows of the
   pairs' tokens (top-k adds a token; their order, so out's last bits, vary from run to run).

What a call holds beside its output is the activations, [pairs, I] in the compute dtype: less than
the padded runs' rows the fit plan's workspace counts (runtime/planner/footprint.py).

A program whose tile starts past its expert's count returns at once, so the grid can be sized by
the largest count without a host sync. Weights are read where they are (a record row's typed view
at the part's element offset); only float records take this path (bf16/f16 parts in the compute
dtype, RecordViews.in_place), the others go through experts_from_records. The torch twin with the
same arithmetic is `grouped_experts_ref`; tests run the kernel under TRITON_INTERPRET=1 against it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .grouped_experts_ref import check_grouped_args, tile_rows


@triton.jit
def _gate_up_kernel(x_ptr, stride_x, w_ptr, stride_row, w13_at, rows_ptr, starts_ptr, counts_ptr, tokens_ptr,
                    act_ptr, stride_act, HIDDEN: tl.constexpr, INTER: tl.constexpr, BLOCK_M: tl.constexpr,
                    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, UPCAST: tl.constexpr):
    e = tl.program_id(0)
    m0 = tl.program_id(1) * BLOCK_M
    count = tl.load(counts_ptr + e)
    if m0 >= count:
        return
    start = tl.load(starts_ptr + e)
    row = tl.load(rows_ptr + e).to(tl.int64)
    offs_m = m0 + tl.arange(0, BLOCK_M)
    mask_m = offs_m < count
    token = tl.load(tokens_ptr + start + offs_m, mask=mask_m, other=0).to(tl.int64)
    offs_n = tl.program_id(2) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < INTER
    offs_k = tl.arange(0, BLOCK_K)
    gate_rows = w_ptr + row * stride_row + w13_at + offs_n.to(tl.int64)[None, :] * HIDDEN  # [1, BN]
    up_rows = gate_rows + INTER * HIDDEN
    acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, HIDDEN, BLOCK_K):
        k = k0 + offs_k
        mask_k = k < HIDDEN
        xt = tl.load(x_ptr + token[:, None] * stride_x + k[None, :], mask=mask_m[:, None] & mask_k[None, :], other=0.0)
        wmask = mask_k[:, None] & mask_n[None, :]
        wg = tl.load(gate_rows + k[:, None], mask=wmask, other=0.0)  # [BK, BN]
        wu = tl.load(up_rows + k[:, None], mask=wmask, other=0.0)
        if UPCAST:
            xt, wg, wu = xt.to(tl.float32), wg.to(tl.float32), wu.to(tl.float32)
        acc_g = tl.dot(xt, wg, acc_g)
        acc_u = tl.dot(xt, wu, acc_u)
    act = acc_g / (1.0 + tl.exp(-acc_g)) * acc_u
    at = act_ptr + (start + offs_m).to(tl.int64)[:, None] * stride_act + offs_n[None, :]
    tl.store(at, act.to(act_ptr.dtype.element_ty), mask=mask_m[:, None] & mask_n[None, :])


@triton.jit
def _down_kernel(act_ptr, stride_act, w_ptr, stride_row, w2_at, rows_ptr, starts_ptr, counts_ptr, tokens_ptr,
                 pair_weight_ptr, out_ptr, stride_out, HIDDEN: tl.constexpr, INTER: tl.constexpr, BLOCK_M: tl.constexpr,
                 BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, UPCAST: tl.constexpr):
    e = tl.program_id(0)
    m0 = tl.program_id(1) * BLOCK_M
    count = tl.load(counts_ptr + e)
    if m0 >= count:
        return
    start = tl.load(starts_ptr + e)
    row = tl.load(rows_ptr + e).to(tl.int64)
    offs_m = m0 + tl.arange(0, BLOCK_M)
    mask_m = offs_m < count
    sorted_at = (start + offs_m).to(tl.int64)
    offs_n = tl.program_id(2) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < HIDDEN
    offs_k = tl.arange(0, BLOCK_K)
    down_rows = w_ptr + row * stride_row + w2_at + offs_n.to(tl.int64)[None, :] * INTER  # [1, BN]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, INTER, BLOCK_K):
        k = k0 + offs_k
        mask_k = k < INTER
        a = tl.load(act_ptr + sorted_at[:, None] * stride_act + k[None, :], mask=mask_m[:, None] & mask_k[None, :],
                    other=0.0)
        w = tl.load(down_rows + k[:, None], mask=mask_k[:, None] & mask_n[None, :], other=0.0)  # [BK, BN]
        if UPCAST:
            a, w = a.to(tl.float32), w.to(tl.float32)
        acc = tl.dot(a, w, acc)
    acc *= tl.load(pair_weight_ptr + sorted_at, mask=mask_m, other=0.0)[:, None]
    token = tl.load(tokens_ptr + sorted_at, mask=mask_m, other=0).to(tl.int64)
    tl.atomic_add(out_ptr + token[:, None] * stride_out + offs_n[None, :], acc, mask=mask_m[:, None] & mask_n[None, :],
                  sem="relaxed")


def grouped_experts(x: torch.Tensor, records: torch.Tensor, *, w13_offset: int, w2_offset: int, hidden: int,
                    inter: int, rows: torch.Tensor, starts: torch.Tensor, counts: torch.Tensor, tokens: torch.Tensor,
                    pair_weights: torch.Tensor, max_count: int, out: torch.Tensor) -> None:
    """out[tokens[p]] += pair_weights[p] * expert_{row of p}(x[tokens[p]]) for every sorted pair p.

    x [T, H] in the records' float dtype; `records` uint8 [N, >= stride] (record rows: a bank
    buffer or cache slots); w13 [2I, H] and w2 [H, I] at byte offsets `w13_offset`, `w2_offset` of
    each row; per expert e of the plan: its record row rows[e], its pairs' first sorted position
    starts[e] and their number counts[e] (int64, on the device); per sorted pair its token and
    routing weight (fp32); `max_count`: the largest count (a host number: it sizes the grid);
    out [T, H] fp32."""
    check_grouped_args(x, records, w13_offset, w2_offset, hidden, inter, out)
    num_experts, num_pairs = rows.numel(), tokens.numel()
    if num_experts == 0 or num_pairs == 0:
        return
    esize = x.element_size()
    weights = records.view(x.dtype)  # [N, row bytes / esize]
    block_m = tile_rows(num_pairs / num_experts)
    act = torch.empty(num_pairs, inter, dtype=x.dtype, device=x.device)
    m_tiles = triton.cdiv(max_count, block_m)
    upcast = x.device.type != "cuda"  # the interpreter (tests): its tl.dot multiplies bf16 as integer bits
    _gate_up_kernel[(num_experts, m_tiles, triton.cdiv(inter, 64))](
        x, x.stride(0), weights, weights.stride(0), w13_offset // esize, rows, starts, counts, tokens, act,
        act.stride(0), HIDDEN=hidden, INTER=inter, BLOCK_M=block_m, BLOCK_N=64, BLOCK_K=64, UPCAST=upcast, num_warps=4)
    _down_kernel[(num_experts, m_tiles, triton.cdiv(hidden, 64))](
        act, act.stride(0), weights, weights.stride(0), w2_offset // esize, rows, starts, counts, tokens, pair_weights,
        out, out.stride(0), HIDDEN=hidden, INTER=inter, BLOCK_M=block_m, BLOCK_N=64, BLOCK_K=64, UPCAST=upcast,
        num_warps=4)
