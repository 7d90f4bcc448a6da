"""Triton kernels: a prompt chunk's block-scaled FP8 experts (the FP8 checkpoints of DeepSeek, Qwen
and GLM: e4m3 weights, one float32 scale per 128 x 128 block) as two grouped GEMMs over the
records read in place, each weight tile widened in registers.

grouped_experts.py's structure and arithmetic (its docstring says why two launches, how the pairs
are sorted and tiled, why a tile past its expert's count returns at once), with the weights read
as FP8 bytes: a [BLOCK_N, BLOCK_K] tile is decoded to float32 as fp8_gemv.py decodes it (integer
ops: exact, and the interpreter runs it), times each value's block scale, rounded to the compute
dtype (what records.dequantize_fp8 and a cast give the padded runs) and multiplied with the
tokens' [BLOCK_M, BLOCK_K] tile in tl.dot, accumulated in fp32:

1. `_gate_up_kernel`, grid (experts, M tiles, I / BLOCK_N): act = silu(x W1^T) * (x W3^T), the
   gate's rows [n0, n0 + BLOCK_N) of w13 with w1_scale, the up's (I rows on) with w3_scale,
   stored in the compute dtype at the pairs' sorted positions.
2. `_down_kernel`, grid (experts, M tiles, H / BLOCK_N): act against W2's rows with w2_scale,
   times each pair's routing weight, added atomically into the fp32 output.

No weight is widened in memory: the padded runs dequantized COPIED_EXPERTS experts at a time into
a float32 copy and a bf16 one (6x their bytes, and a dozen launches a run). H and I must be whole
64-value tiles; any scale block shape is read (each value's scale is gathered). The torch twin
with the same arithmetic is `grouped_fp8_experts_ref`; tests run the kernel under
TRITON_INTERPRET=1 against it and against the padded runs.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .fp8_gemv import KINDS, _fp8_to_f32
from .grouped_block_experts import _rounded
from .grouped_experts_ref import tile_rows
from .grouped_fp8_experts_ref import TILE, Fp8Part, check_fp8_args

LAUNCH = {"num_warps": 4, "num_stages": 1}


@triton.jit
def _weight_tile(rows, scale_rows, k, BC: tl.constexpr, KIND: tl.constexpr, DTYPE: tl.constexpr,
                 UPCAST: tl.constexpr):
    """Columns `k` [BK] of the FP8 rows at byte pointers `rows` [BN, 1], their block scales' rows at
    float pointers `scale_rows` [BN, 1], in the compute dtype [BN, BK] (`_rounded`)."""
    raw = tl.load(rows + k[None, :]).to(tl.int32)
    scale = tl.load(scale_rows + (k // BC)[None, :])
    return _rounded(_fp8_to_f32(raw, KIND) * scale, DTYPE, UPCAST)


@triton.jit
def _gate_up_kernel(x_ptr, stride_x, rec_ptr, stride_row, gate_at, gate_scale_at, up_at, up_scale_at, rows_ptr,
                    starts_ptr, counts_ptr, tokens_ptr, act_ptr, stride_act, HIDDEN: tl.constexpr,
                    INTER: tl.constexpr, KIND: tl.constexpr, BR: tl.constexpr, BC: tl.constexpr,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, UPCAST: tl.constexpr):
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
    offs_n = (tl.program_id(2) * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)[:, None]  # (I is whole tiles)
    record = rec_ptr + row * stride_row
    scale_cols: tl.constexpr = (HIDDEN + BC - 1) // BC
    gate_rows, up_rows = record + gate_at + offs_n * HIDDEN, record + up_at + offs_n * HIDDEN  # [BN, 1]
    gate_scales = (record + gate_scale_at).to(tl.pointer_type(tl.float32)) + (offs_n // BR) * scale_cols
    up_scales = (record + up_scale_at).to(tl.pointer_type(tl.float32)) + (offs_n // BR) * scale_cols
    offs_k = tl.arange(0, BLOCK_K)
    dtype = act_ptr.dtype.element_ty
    acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, HIDDEN, BLOCK_K):
        k = k0 + offs_k
        xt = tl.load(x_ptr + token[:, None] * stride_x + k[None, :], mask=mask_m[:, None], other=0.0)
        if UPCAST:
            xt = xt.to(tl.float32)
        wg = _weight_tile(gate_rows, gate_scales, k, BC, KIND, dtype, UPCAST)  # [BN, BK]
        wu = _weight_tile(up_rows, up_scales, k, BC, KIND, dtype, UPCAST)
        acc_g = tl.dot(xt, tl.trans(wg), acc_g)
        acc_u = tl.dot(xt, tl.trans(wu), acc_u)
    act = acc_g / (1.0 + tl.exp(-acc_g)) * acc_u
    at = act_ptr + (start + offs_m).to(tl.int64)[:, None] * stride_act + tl.trans(offs_n)
    tl.store(at, _rounded(act, dtype, UPCAST).to(dtype), mask=mask_m[:, None] & (tl.trans(offs_n) < INTER))


@triton.jit
def _down_kernel(act_ptr, stride_act, rec_ptr, stride_row, down_at, down_scale_at, rows_ptr, starts_ptr, counts_ptr,
                 tokens_ptr, pair_weight_ptr, out_ptr, stride_out, HIDDEN: tl.constexpr, INTER: tl.constexpr,
                 KIND: tl.constexpr, BR: tl.constexpr, BC: tl.constexpr, BLOCK_M: tl.constexpr,
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
    offs_n = (tl.program_id(2) * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)[:, None]  # (H is whole tiles)
    record = rec_ptr + row * stride_row
    scale_cols: tl.constexpr = (INTER + BC - 1) // BC
    down_rows = record + down_at + offs_n * INTER  # [BN, 1]
    down_scales = (record + down_scale_at).to(tl.pointer_type(tl.float32)) + (offs_n // BR) * scale_cols
    offs_k = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, INTER, BLOCK_K):
        k = k0 + offs_k
        a = tl.load(act_ptr + sorted_at[:, None] * stride_act + k[None, :], mask=mask_m[:, None], other=0.0)
        if UPCAST:
            a = a.to(tl.float32)
        w = _weight_tile(down_rows, down_scales, k, BC, KIND, act_ptr.dtype.element_ty, UPCAST)
        acc = tl.dot(a, tl.trans(w), acc)
    acc *= tl.load(pair_weight_ptr + sorted_at, mask=mask_m, other=0.0)[:, None]
    token = tl.load(tokens_ptr + sorted_at, mask=mask_m, other=0).to(tl.int64)
    tl.atomic_add(out_ptr + token[:, None] * stride_out + tl.trans(offs_n), acc,
                  mask=mask_m[:, None] & (tl.trans(offs_n) < HIDDEN), sem="relaxed")


def grouped_fp8_experts(x: torch.Tensor, records: torch.Tensor, *, gate: Fp8Part, up: Fp8Part, down: Fp8Part,
                        hidden: int, inter: int, kind: str, block: tuple[int, int], rows: torch.Tensor,
                        starts: torch.Tensor, counts: torch.Tensor, tokens: torch.Tensor, pair_weights: torch.Tensor,
                        max_count: int, out: torch.Tensor) -> None:
    """out[tokens[p]] += pair_weights[p] * expert_{row of p}(x[tokens[p]]) for every sorted pair p,
    the experts' FP8 weights and their float32 block scales read in place from `records` (uint8
    [N, >= stride]).

    `gate`, `up` ([I, H] each) and `down` ([H, I]): (the weight's byte offset within a row, its
    scales' byte offset), as RecordViews.fp8_parts gives them; `kind` f8_e4m3 or f8_e5m2; `block`
    the scales' block (rows, columns); H and I multiples of 64. The rest as
    grouped_experts.grouped_experts: x [T, H] bf16 or f16 (the compute dtype), the plan's rows,
    starts, counts (int64, on the device), tokens and fp32 pair weights per sorted pair,
    `max_count` (a host number: it sizes the grid), out [T, H] fp32."""
    check_fp8_args(x, records, gate, up, down, hidden, inter, kind, block, out)
    num_experts, num_pairs = rows.numel(), tokens.numel()
    if num_experts == 0 or num_pairs == 0:
        return
    block_m = tile_rows(num_pairs / num_experts)
    act = torch.empty(num_pairs, inter, dtype=x.dtype, device=x.device)
    m_tiles = triton.cdiv(max_count, block_m)
    upcast = x.device.type != "cuda"  # the interpreter (tests): its tl.dot multiplies bf16 as integer bits
    shape = {"KIND": KINDS[kind], "BR": block[0], "BC": block[1], "BLOCK_M": block_m, "BLOCK_N": TILE,
             "BLOCK_K": TILE, "UPCAST": upcast}
    _gate_up_kernel[(num_experts, m_tiles, inter // TILE)](
        x, x.stride(0), records, records.stride(0), *gate, *up, rows, starts, counts, tokens, act, act.stride(0),
        HIDDEN=hidden, INTER=inter, **shape, **LAUNCH)
    _down_kernel[(num_experts, m_tiles, hidden // TILE)](
        act, act.stride(0), records, records.stride(0), *down, rows, starts, counts, tokens, pair_weights, out,
        out.stride(0), HIDDEN=hidden, INTER=inter, **shape, **LAUNCH)
