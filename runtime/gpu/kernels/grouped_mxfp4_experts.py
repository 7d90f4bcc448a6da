"""Triton kernels: a prompt chunk's MXFP4 experts (gpt-oss's, as released and as GGUF files store
them) as two grouped GEMMs over the records read in place, with the records' biases and the bank's
activation (gpt-oss's clamped SwiGLU among them).

grouped_experts.py's structure (its docstring says why two launches, how the pairs are sorted and
tiled, why a tile past its expert's count returns at once), with the weights read as GGML MXFP4
rows: 32-value blocks of an e8m0 exponent byte and 16 bytes of e2m1 nibbles (value j the low
nibble of byte j, value j + 16 the high one). A [BLOCK_N, BLOCK_K] tile is decoded as ggml_dequant
decodes it (E2M1 value times 2^(e - 127), exact), rounded to the compute dtype (what
dequantize_blocks and a cast give the padded runs), and multiplied with the tokens' tile in
tl.dot, accumulated in fp32:

1. `_gate_up_kernel`, grid (experts, M tiles, I / BLOCK_N): gate and up (w13's first I rows, then
   the next I) plus their w13 biases, the activation (slot_experts._activation: silu(g) * u,
   DeepSeek-V4's clamped form, or gpt-oss's g * sigmoid(alpha g) * (u + 1) on the clamps), stored
   in the compute dtype at the pairs' sorted positions.
2. `_down_kernel`, grid (experts, M tiles, H / BLOCK_N): the activations against W2's rows plus the
   w2 bias, times each pair's routing weight, added atomically into the fp32 output.

The padded runs this replaces dequantized COPIED_EXPERTS experts at a time into float32 and bf16
copies (a dozen launches a run). H and I must be whole 32-value blocks (gpt-oss: 2880). The torch
twin with the same arithmetic is `grouped_mxfp4_experts_ref`; tests run the kernel under
TRITON_INTERPRET=1 against it and against the padded runs.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .ggml_dequant import _e2m1
from .grouped_block_experts import _rounded
from .grouped_experts_ref import tile_rows
from .grouped_mxfp4_experts_ref import BIAS_KINDS, BLOCK_BYTES, check_mxfp4_args
from .slot_experts import _activation
from .slot_experts_ref import ACTIVATIONS

LAUNCH = {"num_warps": 4, "num_stages": 1}
BLOCK_N = 64
BIAS_CODES = {None: 0, "bf16": 1, "f16": 2, "f32": 3}


@triton.jit
def _weight_tile(rows, k, DTYPE: tl.constexpr, UPCAST: tl.constexpr):
    """Values `k` [BK] of the MXFP4 rows at byte pointers `rows` [BN, 1], in the compute dtype [BN, BK]."""
    block = rows + (k // 32 * 17)[None, :]  # [BN, BK]: each value's block
    j = (k % 32)[None, :]
    packed = tl.load(block + 1 + j % 16).to(tl.int32)
    nibble = tl.where(j < 16, packed & 0xF, packed >> 4)
    e = tl.load(block).to(tl.float32)
    return _rounded(_e2m1(nibble) * tl.exp2(e - 127.0), DTYPE, UPCAST)


@triton.jit
def _bias(record, at, n, BIAS: tl.constexpr):
    """Values `n` of the bias at byte `at` of `record`, float32 (0 without biases)."""
    if BIAS == 1:
        return tl.load((record + at).to(tl.pointer_type(tl.bfloat16)) + n).to(tl.float32)
    if BIAS == 2:
        return tl.load((record + at).to(tl.pointer_type(tl.float16)) + n).to(tl.float32)
    if BIAS == 3:
        return tl.load((record + at).to(tl.pointer_type(tl.float32)) + n)
    return tl.zeros(n.shape, dtype=tl.float32)


@triton.jit
def _gate_up_kernel(x_ptr, stride_x, rec_ptr, stride_row, w13_at, w13_bias_at, rows_ptr, starts_ptr, counts_ptr,
                    tokens_ptr, act_ptr, stride_act, alpha, limit, HIDDEN: tl.constexpr, INTER: tl.constexpr,
                    ACT: tl.constexpr, BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
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
    token = tl.load(tokens_ptr + start + offs_m, mask=mask_m, other=0).to(tl.int64)
    n = tl.program_id(2) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = n < INTER
    safe_n = tl.where(mask_n, n, 0).to(tl.int64)[:, None]  # (rows past I read row 0: the record's own bytes)
    record = rec_ptr + row * stride_row
    row_bytes: tl.constexpr = HIDDEN // 32 * 17
    gate_rows = record + w13_at + safe_n * row_bytes  # [BN, 1]
    up_rows = gate_rows + INTER * row_bytes
    offs_k = tl.arange(0, BLOCK_K)
    dtype = act_ptr.dtype.element_ty
    acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, HIDDEN, BLOCK_K):
        k = k0 + offs_k
        xt = tl.load(x_ptr + token[:, None] * stride_x + k[None, :], mask=mask_m[:, None], other=0.0)
        if UPCAST:
            xt = xt.to(tl.float32)
        acc_g = tl.dot(xt, tl.trans(_weight_tile(gate_rows, k, dtype, UPCAST)), acc_g)
        acc_u = tl.dot(xt, tl.trans(_weight_tile(up_rows, k, dtype, UPCAST)), acc_u)
    safe = tl.where(mask_n, n, 0)
    g = acc_g + _bias(record, w13_bias_at, safe, BIAS)[None, :]
    u = acc_u + _bias(record, w13_bias_at, safe + INTER, BIAS)[None, :]
    act = _activation(g, u, alpha, limit, ACT)
    at = act_ptr + (start + offs_m).to(tl.int64)[:, None] * stride_act + n[None, :]
    tl.store(at, _rounded(act, dtype, UPCAST).to(dtype), mask=mask_m[:, None] & mask_n[None, :])


@triton.jit
def _down_kernel(act_ptr, stride_act, rec_ptr, stride_row, w2_at, w2_bias_at, rows_ptr, starts_ptr, counts_ptr,
                 tokens_ptr, pair_weight_ptr, out_ptr, stride_out, HIDDEN: tl.constexpr, INTER: tl.constexpr,
                 BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                 UPCAST: tl.constexpr):
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
    n = tl.program_id(2) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = n < HIDDEN
    safe_n = tl.where(mask_n, n, 0).to(tl.int64)[:, None]
    record = rec_ptr + row * stride_row
    row_bytes: tl.constexpr = INTER // 32 * 17
    down_rows = record + w2_at + safe_n * row_bytes  # [BN, 1]
    offs_k = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, INTER, BLOCK_K):
        k = k0 + offs_k
        a = tl.load(act_ptr + sorted_at[:, None] * stride_act + k[None, :], mask=mask_m[:, None], other=0.0)
        if UPCAST:
            a = a.to(tl.float32)
        acc = tl.dot(a, tl.trans(_weight_tile(down_rows, k, act_ptr.dtype.element_ty, UPCAST)), acc)
    acc += _bias(record, w2_bias_at, tl.where(mask_n, n, 0), BIAS)[None, :]
    acc *= tl.load(pair_weight_ptr + sorted_at, mask=mask_m, other=0.0)[:, None]
    token = tl.load(tokens_ptr + sorted_at, mask=mask_m, other=0).to(tl.int64)
    tl.atomic_add(out_ptr + token[:, None] * stride_out + n[None, :], acc, mask=mask_m[:, None] & mask_n[None, :],
                  sem="relaxed")


def grouped_mxfp4_experts(x: torch.Tensor, records: torch.Tensor, *, w13_at: int, w2_at: int, w13_bias_at: int,
                          w2_bias_at: int, bias_kind: str | None, hidden: int, inter: int, act: str, alpha: float,
                          limit: float, rows: torch.Tensor, starts: torch.Tensor, counts: torch.Tensor,
                          tokens: torch.Tensor, pair_weights: torch.Tensor, max_count: int, out: torch.Tensor) -> None:
    """out[tokens[p]] += pair_weights[p] * expert_{row of p}(x[tokens[p]]) for every sorted pair p,
    the experts' MXFP4 weights (w13 [2I, H]: gate rows, then up; w2 [H, I]) and their biases
    (`bias_kind` bf16, f16 or f32; None: none) read in place from `records` (uint8 [N, >= stride])
    at the byte offsets RecordViews.mxfp4_block_parts gives, with activation `act` (swiglu,
    swiglu_limited or swiglu_clamped; `alpha`, `limit` its constants). The rest as
    grouped_experts.grouped_experts."""
    check_mxfp4_args(x, records, w13_at=w13_at, w2_at=w2_at, w13_bias_at=w13_bias_at, w2_bias_at=w2_bias_at,
                     bias_kind=bias_kind, hidden=hidden, inter=inter, act=act, out=out)
    num_experts, num_pairs = rows.numel(), tokens.numel()
    if num_experts == 0 or num_pairs == 0:
        return
    assert BLOCK_BYTES == 17 and (bias_kind is None or bias_kind in BIAS_KINDS)
    block_m = tile_rows(num_pairs / num_experts)
    block_k = 64 if hidden % 64 == 0 and inter % 64 == 0 else 32
    act_out = torch.empty(num_pairs, inter, dtype=x.dtype, device=x.device)
    m_tiles = triton.cdiv(max_count, block_m)
    upcast = x.device.type != "cuda"  # the interpreter (tests): its tl.dot multiplies bf16 as integer bits
    shape = {"HIDDEN": hidden, "INTER": inter, "BIAS": BIAS_CODES[bias_kind], "BLOCK_M": block_m,
             "BLOCK_N": BLOCK_N, "BLOCK_K": block_k, "UPCAST": upcast}
    _gate_up_kernel[(num_experts, m_tiles, triton.cdiv(inter, BLOCK_N))](
        x, x.stride(0), records, records.stride(0), w13_at, max(w13_bias_at, 0), rows, starts, counts, tokens,
        act_out, act_out.stride(0), float(alpha), float(limit), ACT=ACTIVATIONS[act], **shape, **LAUNCH)
    _down_kernel[(num_experts, m_tiles, triton.cdiv(hidden, BLOCK_N))](
        act_out, act_out.stride(0), records, records.stride(0), w2_at, max(w2_bias_at, 0), rows, starts, counts,
        tokens, pair_weights, out, out.stride(0), **shape, **LAUNCH)
