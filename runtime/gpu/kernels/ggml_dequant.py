"""Triton device functions shared by the kernels that read GGML block-quant weights in place
(block_gemv.py: decode's rows times a vector; grouped_block_experts.py: a prompt chunk's experts):
a super-block of 256 values (Q8_0: eight of its 32-value blocks) dequantized in registers as
gguf-py does (each sub-block's scale d x sc and min dmin x m in float32, then d x q - dm;
`runtime/experts/ggml_blocks.py` is the torch form tests hold it to).
"""

from __future__ import annotations

import triton
import triton.language as tl

Q4_K, Q5_K, Q6_K, Q8_0 = 0, 1, 2, 3
KINDS = {"q4_k": Q4_K, "q5_k": Q5_K, "q6_k": Q6_K, "q8_0": Q8_0}
SUPER_BLOCK_BYTES = {Q4_K: 144, Q5_K: 176, Q6_K: 210, Q8_0: 8 * 34}  # bytes of 256 values


@triton.jit
def _f16_at(ptr):
    """The little-endian float16 at byte `ptr`, as float32."""
    lo = tl.load(ptr).to(tl.uint16)
    hi = tl.load(ptr + 1).to(tl.uint16)
    return (lo | (hi << 8)).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _scale_min_k4(head, j):
    """Q4_K's and Q5_K's 6-bit scale and min of sub-block j (0..7), from the 12 bytes at head + 4."""
    qa = tl.load(head + 4 + j).to(tl.int32)  # q[j]
    qb = tl.load(head + 8 + j).to(tl.int32)  # q[j + 4]
    qc = tl.load(head + 4 + (j % 4)).to(tl.int32)  # q[j - 4] where j >= 4
    low = j < 4
    sc = tl.where(low, qa & 63, (qb & 0xF) | ((qc >> 6) << 4))
    mn = tl.where(low, qb & 63, (qb >> 4) | ((qa >> 6) << 4))
    return sc.to(tl.float32), mn.to(tl.float32)


@triton.jit
def dequant(blk, v, KIND: tl.constexpr):
    """Super-blocks at byte pointers `blk` [R, 1] -> their values at positions `v` [V] (any of 0..255)
    as float32 [R, V]."""
    if KIND == 3:  # Q8_0: eight 34-byte blocks, an fp16 scale then 32 int8
        at = blk + (v // 32)[None, :] * 34
        q = tl.load(at + 2 + (v % 32)[None, :]).to(tl.int8, bitcast=True).to(tl.float32)
        return q * _f16_at(at)
    if KIND == 2:  # Q6_K: ql[128], qh[64], int8 scales[16], d
        half, r = v // 128, v % 128
        ql = tl.load(blk + (half * 64 + r % 64)[None, :]).to(tl.int32)
        ql = (ql >> (4 * (r // 64))[None, :]) & 0xF
        qh = tl.load(blk + (128 + half * 32 + r % 32)[None, :]).to(tl.int32)
        qh = (qh >> (2 * (r // 32))[None, :]) & 3
        sc = tl.load(blk + (192 + v // 16)[None, :]).to(tl.int8, bitcast=True).to(tl.float32)
        return (_f16_at(blk + 208) * sc) * ((ql | (qh << 4)) - 32).to(tl.float32)
    j = v // 32  # Q4_K, Q5_K: d, dmin, 12 bytes of scales and mins, (Q5_K: qh[32],) qs[128]
    sc, mn = _scale_min_k4(blk, j[None, :])
    d = _f16_at(blk) * sc
    dm = _f16_at(blk + 2) * mn
    w = v % 64
    qs_at: tl.constexpr = 16 if KIND == 0 else 48
    q = tl.load(blk + (qs_at + (v // 64) * 32 + w % 32)[None, :]).to(tl.int32)
    q = (q >> (4 * (w // 32))[None, :]) & 0xF
    if KIND == 1:
        qh = tl.load(blk + (16 + v % 32)[None, :]).to(tl.int32)
        q = q | (((qh >> j[None, :]) & 1) << 4)
    return d * q.to(tl.float32) - dm
