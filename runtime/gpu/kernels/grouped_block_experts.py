"""Triton kernels: a prompt chunk's GGUF experts (Q4_K, Q5_K, Q6_K, Q8_0 parts) as two grouped
GEMMs over the records read in place, each weight tile dequantized in registers.

grouped_experts.py's structure and arithmetic (its docstring says why two launches, how the pairs
are sorted and tiled, why a tile past its expert's count returns at once), with the weights read
as GGML rows: a [BLOCK_N, BLOCK_K] tile of BLOCK_N weight rows over BLOCK_K values of one
256-value super-block is dequantized as gguf-py does (ggml_dequant.dequant, which block_gemv.py's
decode kernel shares), rounded to the compute dtype (what RecordViews.weights gives the padded
runs), and multiplied with the tokens' [BLOCK_M, BLOCK_K] tile in tl.dot, accumulated in fp32:

1. `_gate_up_kernel`, grid (experts, M tiles, I / BLOCK_N): act = silu(x W1^T) * (x W3^T) with
   the gate and up rows [n0, n0 + BLOCK_N), stored in the compute dtype at the pairs' sorted
   positions. Gate and up are one w13 part (up's rows I rows after the gate's) or two parts
   stored apart (GGUF experts whose types differ): each has its own offset and type.
2. `_down_kernel`, grid (experts, M tiles, H / BLOCK_N): act against W2's rows (Q4_K_M stores
   down as Q6_K: 210 bytes a super-block where gate and up have 144), times each pair's routing
   weight, added atomically into the fp32 output.

No weight is copied or widened in memory: where the padded runs dequantized every expert of a
chunk into a bf16 copy (3.6x a Q4_K part's bytes, 2.4x a Q6_K part's), here each tile is read
from the record row where it lies (a streamed bank's row, a cache slot). H and I must be whole
super-blocks (256 values). The torch twin with the same arithmetic is `grouped_block_experts_ref`;
tests run the kernel under TRITON_INTERPRET=1 against it and against the padded runs.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .ggml_dequant import KINDS, SUPER_BLOCK_BYTES, dequant
from .grouped_block_experts_ref import Part, check_block_args
from .grouped_experts_ref import tile_rows

# One stage: the software pipeliner would stage the tiles' byte gathers in shared memory (sm_90,
# Q5_K gate|up: 240 KB at triton's default 3 stages, past the H200's 227 KB; 24 KB at one).
LAUNCH = {"num_warps": 4, "num_stages": 1}


@triton.jit
def _rounded(v, DTYPE: tl.constexpr, UPCAST: tl.constexpr):
    """fp32 `v` rounded to the nearest DTYPE (bf16 or f16) value, in DTYPE; under the interpreter
    (UPCAST) that value in fp32, rounded by hand for bf16: triton 3.6's interpreter truncates
    fp32 -> bf16 (the device and torch round to nearest even)."""
    if UPCAST:
        if DTYPE == tl.bfloat16:
            bits = v.to(tl.uint32, bitcast=True)
            return ((bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000).to(tl.float32, bitcast=True)
        return v.to(DTYPE).to(tl.float32)
    return v.to(DTYPE)


@triton.jit
def _weight_tile(rows, b, s, KIND: tl.constexpr, SB_BYTES: tl.constexpr, BLOCK_K: tl.constexpr, DTYPE: tl.constexpr,
                 UPCAST: tl.constexpr):
    """Values [s * BLOCK_K, (s + 1) * BLOCK_K) of super-block b of the GGML rows at byte pointers
    `rows` [BN, 1], in the compute dtype [BN, BLOCK_K] (`_rounded`)."""
    return _rounded(dequant(rows + b * SB_BYTES, s * BLOCK_K + tl.arange(0, BLOCK_K), KIND), DTYPE, UPCAST)


@triton.jit
def _gate_up_kernel(x_ptr, stride_x, rec_ptr, stride_row, gate_at, up_at, rows_ptr, starts_ptr, counts_ptr,
                    tokens_ptr, act_ptr, stride_act, HIDDEN: tl.constexpr, INTER: tl.constexpr,
                    GATE_KIND: tl.constexpr, GATE_SB: tl.constexpr, UP_KIND: tl.constexpr, UP_SB: tl.constexpr,
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
    offs_n = tl.program_id(2) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < INTER
    safe_n = tl.where(mask_n, offs_n, 0).to(tl.int64)[:, None]  # (rows past I read row 0: the record's own bytes)
    record = rec_ptr + row * stride_row
    gate_rows = record + gate_at + safe_n * (HIDDEN // 256 * GATE_SB)  # [BN, 1] byte pointers
    up_rows = record + up_at + safe_n * (HIDDEN // 256 * UP_SB)
    offs_k = tl.arange(0, BLOCK_K)
    dtype = act_ptr.dtype.element_ty
    acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for b in range(0, HIDDEN // 256):
        for s in tl.static_range(256 // BLOCK_K):
            k = b * 256 + s * BLOCK_K + offs_k
            xt = tl.load(x_ptr + token[:, None] * stride_x + k[None, :], mask=mask_m[:, None], other=0.0)
            if UPCAST:
                xt = xt.to(tl.float32)
            wg = _weight_tile(gate_rows, b, s, GATE_KIND, GATE_SB, BLOCK_K, dtype, UPCAST)  # [BN, BK]
            wu = _weight_tile(up_rows, b, s, UP_KIND, UP_SB, BLOCK_K, dtype, UPCAST)
            acc_g = tl.dot(xt, tl.trans(wg), acc_g)
            acc_u = tl.dot(xt, tl.trans(wu), acc_u)
    act = acc_g / (1.0 + tl.exp(-acc_g)) * acc_u
    at = act_ptr + (start + offs_m).to(tl.int64)[:, None] * stride_act + offs_n[None, :]
    tl.store(at, _rounded(act, dtype, UPCAST).to(dtype), mask=mask_m[:, None] & mask_n[None, :])


@triton.jit
def _down_kernel(act_ptr, stride_act, rec_ptr, stride_row, down_at, rows_ptr, starts_ptr, counts_ptr, tokens_ptr,
                 pair_weight_ptr, out_ptr, stride_out, HIDDEN: tl.constexpr, INTER: tl.constexpr,
                 DOWN_KIND: tl.constexpr, DOWN_SB: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 BLOCK_K: tl.constexpr, UPCAST: tl.constexpr):
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
    safe_n = tl.where(mask_n, offs_n, 0).to(tl.int64)[:, None]
    down_rows = rec_ptr + row * stride_row + down_at + safe_n * (INTER // 256 * DOWN_SB)  # [BN, 1]
    offs_k = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for b in range(0, INTER // 256):
        for s in tl.static_range(256 // BLOCK_K):
            k = b * 256 + s * BLOCK_K + offs_k
            a = tl.load(act_ptr + sorted_at[:, None] * stride_act + k[None, :], mask=mask_m[:, None], other=0.0)
            if UPCAST:
                a = a.to(tl.float32)
            w = _weight_tile(down_rows, b, s, DOWN_KIND, DOWN_SB, BLOCK_K, act_ptr.dtype.element_ty, UPCAST)
            acc = tl.dot(a, tl.trans(w), acc)
    acc *= tl.load(pair_weight_ptr + sorted_at, mask=mask_m, other=0.0)[:, None]
    token = tl.load(tokens_ptr + sorted_at, mask=mask_m, other=0).to(tl.int64)
    tl.atomic_add(out_ptr + token[:, None] * stride_out + offs_n[None, :], acc, mask=mask_m[:, None] & mask_n[None, :],
                  sem="relaxed")


def grouped_block_experts(x: torch.Tensor, records: torch.Tensor, *, gate: Part, up: Part, down: Part, hidden: int,
                          inter: int, rows: torch.Tensor, starts: torch.Tensor, counts: torch.Tensor,
                          tokens: torch.Tensor, pair_weights: torch.Tensor, max_count: int,
                          out: torch.Tensor) -> None:
    """out[tokens[p]] += pair_weights[p] * expert_{row of p}(x[tokens[p]]) for every sorted pair p,
    the experts' weights GGML rows read in place from `records` (uint8 [N, >= stride]).

    `gate`, `up` ([I, H] each) and `down` ([H, I]): (byte offset within a row, GGML type: q4_k,
    q5_k, q6_k or q8_0), as RecordViews.block_parts gives them; H and I multiples of 256. The
    rest as grouped_experts.grouped_experts: x [T, H] bf16 or f16 (the compute dtype), the plan's
    rows, starts, counts (int64, on the device), tokens and fp32 pair weights per sorted pair,
    `max_count` (a host number: it sizes the grid), out [T, H] fp32."""
    check_block_args(x, records, gate, up, down, hidden, inter, out)
    num_experts, num_pairs = rows.numel(), tokens.numel()
    if num_experts == 0 or num_pairs == 0:
        return
    (gate_at, gate_kind), (up_at, up_kind), (down_at, down_kind) = gate, up, down
    codes = {name: KINDS[kind] for name, kind in (("gate", gate_kind), ("up", up_kind), ("down", down_kind))}
    block_m, block_n, block_k = tile_rows(num_pairs / num_experts), 64, 64
    act = torch.empty(num_pairs, inter, dtype=x.dtype, device=x.device)
    m_tiles = triton.cdiv(max_count, block_m)
    upcast = x.device.type != "cuda"  # the interpreter (tests): its tl.dot multiplies bf16 as integer bits
    _gate_up_kernel[(num_experts, m_tiles, triton.cdiv(inter, block_n))](
        x, x.stride(0), records, records.stride(0), gate_at, up_at, rows, starts, counts, tokens, act, act.stride(0),
        HIDDEN=hidden, INTER=inter, GATE_KIND=codes["gate"], GATE_SB=SUPER_BLOCK_BYTES[codes["gate"]],
        UP_KIND=codes["up"], UP_SB=SUPER_BLOCK_BYTES[codes["up"]], BLOCK_M=block_m, BLOCK_N=block_n,
        BLOCK_K=block_k, UPCAST=upcast, **LAUNCH)
    _down_kernel[(num_experts, m_tiles, triton.cdiv(hidden, block_n))](
        act, act.stride(0), records, records.stride(0), down_at, rows, starts, counts, tokens, pair_weights, out,
        out.stride(0), HIDDEN=hidden, INTER=inter, DOWN_KIND=codes["down"], DOWN_SB=SUPER_BLOCK_BYTES[codes["down"]],
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, UPCAST=upcast, **LAUNCH)
