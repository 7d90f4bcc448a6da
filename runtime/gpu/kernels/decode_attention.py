"""Triton kernels: one decode token's attention over the cached keys, in two launches where torch's
form (runtime/layers/attention.py `_decode_attention`, the semantics this follows) makes about ten
a layer: two matmuls, the casts and scale, the mask's arange, compares and fill, the softmax.

A captured decode step (step_graphs.py) reads the first `span` cached positions and masks those
after the token's position, which it reads from the device (`visible`, int64 [1]), so one graph
serves every position below the span. Here the keys are cut into splits of `chunk_keys`
positions; program (kv head, split) takes that head's group of query heads together (the keys
and values are read once for all of them), skips its split where it lies after the position (or
before a sliding window or a chunk), and keeps a running max, sum and weighted sum of values
over blocks of BLOCK_L keys (the online softmax of flash-decoding). The second launch merges a
query head's splits. Everything after the loads is float32: the scores are not rounded to the
cache's dtype before the softmax as torch's bf16 matmul rounds them, nor the probabilities before
the values' sum, so the result is the exact attention to within float32 sums, rounded once.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

DTYPES = (torch.bfloat16, torch.float16, torch.float32)
MAX_GROUP = 16  # query heads a key head serves (registers: group x BLOCK_L x head_dim products)
MAX_HEAD_DIM = 256
BLOCK_L = 16  # keys a loop step reads
KEYS_PER_SPLIT = 64  # at least; more where the span would need more than MAX_SPLITS
MAX_SPLITS = 128
# The span sets the splits and their keys, both passed as numbers: were either a constexpr, each
# new span (a power of two, device_model.decode_span) would compile the kernels again, seconds
# on the first step past 8k, 16k, 32k... tokens of a conversation (the GPU agent replay of
# 2026-12-07: those turns decoded at 13-16 tok/s, the others at 83-110)
MERGE_SPLITS = triton.next_power_of_2(MAX_SPLITS)


@triton.jit(do_not_specialize=["chunk_keys"])  # (one compilation for every span: MERGE_SPLITS)
def _partial_kernel(q_ptr, k_ptr, v_ptr, visible_ptr, m_ptr, l_ptr, acc_ptr, stride_qh, stride_kl, stride_kh,
                    stride_vl, stride_vh, scale, window, chunk, chunk_keys, GROUP: tl.constexpr,
                    GP: tl.constexpr, D: tl.constexpr, BD: tl.constexpr, DV: tl.constexpr, BDV: tl.constexpr,
                    BLOCK: tl.constexpr):
    h = tl.program_id(0)
    s = tl.program_id(1)
    splits = tl.num_programs(1)
    pos = tl.load(visible_ptr).to(tl.int32)
    lo = s * chunk_keys
    hi = tl.minimum(lo + chunk_keys, pos + 1)
    first = pos * 0
    if window > 0:  # (sliding_causal_attention: keys after pos - window)
        first = tl.maximum(first, pos - window + 1)
    if chunk > 0:  # (chunked_causal_attention: keys of the position's chunk)
        first = tl.maximum(first, pos - pos % chunk)
    lo = tl.maximum(lo, first)
    g = tl.arange(0, GP)
    d = tl.arange(0, BD)
    dv = tl.arange(0, BDV)
    row = (h * splits + s) * GP + g
    if lo >= hi:  # the split lies after the position (or before its window): nothing to add
        tl.store(m_ptr + row, tl.full((GP,), float("-inf"), dtype=tl.float32))
        tl.store(l_ptr + row, tl.zeros((GP,), dtype=tl.float32))
        tl.store(acc_ptr + row[:, None] * BDV + dv[None, :], tl.zeros((GP, BDV), dtype=tl.float32))
        return
    q = tl.load(q_ptr + (h * GROUP + g)[:, None] * stride_qh + d[None, :],
                mask=(g < GROUP)[:, None] & (d < D)[None, :], other=0.0).to(tl.float32)  # [GP, BD]
    m = tl.full((GP,), float("-inf"), dtype=tl.float32)
    total = tl.zeros((GP,), dtype=tl.float32)
    acc = tl.zeros((GP, BDV), dtype=tl.float32)
    start = 0
    while start < chunk_keys:  # (a number, not a constexpr: a while, which Triton's interpreter runs too; the
        # split's blocks outside [lo, hi) add nothing)
        keys = s * chunk_keys + start + tl.arange(0, BLOCK)
        live = (keys >= lo) & (keys < hi)
        k = tl.load(k_ptr + keys[:, None].to(tl.int64) * stride_kl + h * stride_kh + d[None, :],
                    mask=live[:, None] & (d < D)[None, :], other=0.0).to(tl.float32)  # [BLOCK, BD]
        scores = tl.sum(q[:, None, :] * k[None, :, :], axis=2) * scale  # [GP, BLOCK]
        scores = tl.where(live[None, :], scores, float("-inf"))
        m_new = tl.maximum(m, tl.max(scores, axis=1))
        shift = tl.where(m_new == float("-inf"), 0.0, m_new)  # (no live key yet: every term below is 0)
        alpha = tl.exp(m - shift)
        p = tl.exp(scores - shift[:, None])
        total = total * alpha + tl.sum(p, axis=1)
        # the values transposed, [BDV, BLOCK], and the sum over the last axis: Triton rewrites
        # sum(p[:, :, None] * v[None, :, :], axis=1) as a tl.dot in TF32 (its
        # CombineBroadcastMulReducePattern, where every side is >= 16: 12 query heads a key head
        # were off by 1e-3 on the H100)
        vt = tl.load(v_ptr + keys[None, :].to(tl.int64) * stride_vl + h * stride_vh + dv[:, None],
                     mask=live[None, :] & (dv < DV)[:, None], other=0.0).to(tl.float32)  # [BDV, BLOCK]
        acc = acc * alpha[:, None] + tl.sum(p[:, None, :] * vt[None, :, :], axis=2)
        m = m_new
        start += BLOCK
    tl.store(m_ptr + row, m)
    tl.store(l_ptr + row, total)
    tl.store(acc_ptr + row[:, None] * BDV + dv[None, :], acc)


@triton.jit(do_not_specialize=["splits"])  # (4 splits or 64 would compile twice: Triton specializes multiples of 16)
def _merge_kernel(m_ptr, l_ptr, acc_ptr, out_ptr, splits, stride_oh, GROUP: tl.constexpr, GP: tl.constexpr,
                  DV: tl.constexpr, BDV: tl.constexpr, BS: tl.constexpr):
    head = tl.program_id(0)
    h, g = head // GROUP, head % GROUP
    s = tl.arange(0, BS)
    dv = tl.arange(0, BDV)
    live = s < splits
    row = (h * splits + s) * GP + g
    m = tl.load(m_ptr + row, mask=live, other=float("-inf"))
    biggest = tl.max(m, axis=0)  # (finite: the split holding the position is never empty)
    weight = tl.where(live, tl.exp(m - biggest), 0.0)
    total = tl.sum(tl.load(l_ptr + row, mask=live, other=0.0) * weight, axis=0)
    acc = tl.load(acc_ptr + row[:, None] * BDV + dv[None, :], mask=live[:, None], other=0.0)
    out = tl.sum(acc * weight[:, None], axis=0) / total
    tl.store(out_ptr + head * stride_oh + dv, out.to(out_ptr.dtype.element_ty), mask=dv < DV)


def supports(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether `decode_attention` takes this call: CUDA tensors of one float dtype, q [1, Hq, D],
    k [L, Hkv, D] and v [L, Hkv, Dv] with unit channel strides, Hq a multiple of Hkv by at most
    MAX_GROUP, head sizes up to MAX_HEAD_DIM."""
    return (q.is_cuda and q.dim() == 3 and q.shape[0] == 1 and k.dim() == 3 and v.dim() == 3
            and q.dtype in DTYPES and k.dtype == v.dtype == q.dtype and k.shape[:2] == v.shape[:2]
            and q.shape[2] == k.shape[2] and k.shape[1] > 0 and q.shape[1] % k.shape[1] == 0
            and q.shape[1] // k.shape[1] <= MAX_GROUP and max(k.shape[2], v.shape[2]) <= MAX_HEAD_DIM
            and q.stride(2) == k.stride(2) == v.stride(2) == 1 and k.shape[0] > 0)


def decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, visible: torch.Tensor, *,
                     window: int = 0, chunk: int = 0) -> torch.Tensor:
    """[1, Hq, Dv] in v's dtype: the token's attention over k/v's positions up to `visible` (int64
    [1] on the device; `window` > 0: from visible - window + 1; `chunk` > 0: from the start of
    visible's chunk). See `supports` for the calls it takes."""
    span, kv_heads, dim = k.shape
    heads, dim_v = q.shape[1], v.shape[2]
    group = heads // kv_heads
    gp, bd, bdv = max(2, triton.next_power_of_2(group)), triton.next_power_of_2(dim), triton.next_power_of_2(dim_v)
    splits = min(triton.cdiv(span, KEYS_PER_SPLIT), MAX_SPLITS)
    chunk_keys = triton.cdiv(triton.cdiv(span, splits), BLOCK_L) * BLOCK_L
    splits = triton.cdiv(span, chunk_keys)
    m = torch.empty(kv_heads * splits * gp, dtype=torch.float32, device=q.device)
    total = torch.empty_like(m)
    acc = torch.empty(kv_heads * splits * gp, bdv, dtype=torch.float32, device=q.device)
    _partial_kernel[(kv_heads, splits)](q, k, v, visible, m, total, acc, q.stride(1), k.stride(0), k.stride(1),
                                        v.stride(0), v.stride(1), scale, window, chunk, chunk_keys, GROUP=group,
                                        GP=gp, D=dim, BD=bd, DV=dim_v, BDV=bdv, BLOCK=BLOCK_L,
                                        num_warps=4 if gp * bd <= 1024 else 8)
    out = torch.empty(1, heads, dim_v, dtype=v.dtype, device=q.device)
    _merge_kernel[(heads,)](m, total, acc, out, splits, out.stride(1), GROUP=group, GP=gp, DV=dim_v, BDV=bdv,
                            BS=MERGE_SPLITS, num_warps=4)
    return out
