"""Triton device functions shared by the kernels that read GGML block-quant weights in place:
a super-block of 256 values (Q8_0: eight of its 32-value blocks) dequantized in registers as
gguf-py does (each sub-block's scale d x sc and min dmin x m in float32, then d x q - dm;
`runtime/experts/ggml_blocks.py` is the torch form tests hold it to), for grouped_block_experts.py
(a prompt chunk's experts: tiles for tl.dot); or multiplied with 256 inputs without forming the
values (`super_block_dot`, for block_gemv.py: decode's rows times a vector), which is what a
GEMV's time is spent on.
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


@triton.jit
def super_block_dot(blk, x, KIND: tl.constexpr):
    """Rows' super-blocks at byte pointers `blk` [R] times the 256 inputs at `x`: float32 [R].

    A sub-block's scale (and min) is read and applied once, to the dot of its integer quants with
    its inputs, not to each value: for Q4_K and Q5_K, d * sum_j sc_j (q_j . x_j) - dmin * sum_j
    m_j sum(x_j); for Q6_K d * sum_s sc_s (q_s . x_s); for Q8_0 sum_i d_i (q_i . x_i). Each quant
    byte is loaded once for the values it holds (Q4_K's low and high nibbles: sub-blocks 2g and
    2g + 1 of its 64-value group g). The values equal `dequant`'s up to float32 rounding."""
    row = blk[:, None, None]
    if KIND == 3:  # Q8_0: eight 34-byte blocks, an fp16 scale then 32 int8
        i = tl.arange(0, 8)[None, :, None]
        w = tl.arange(0, 32)[None, None, :]
        q = tl.load(row + i * 34 + 2 + w).to(tl.int8, bitcast=True).to(tl.float32)  # [R, 8, 32]
        dots = tl.sum(q * tl.load(x + i * 32 + w).to(tl.float32), axis=2)  # [R, 8]
        return tl.sum(_f16_at(blk[:, None] + tl.arange(0, 8)[None, :] * 34) * dots, axis=1)
    if KIND == 2:  # Q6_K: ql[128], qh[64], int8 scales[16], d; value v = 16 s + t, scale s
        s = tl.arange(0, 16)[None, :, None]
        t = tl.arange(0, 16)[None, None, :]
        half, s8 = s // 8, s % 8
        ql = tl.load(row + half * 64 + (s % 4) * 16 + t).to(tl.int32)
        ql = (ql >> (4 * (s8 // 4))) & 0xF
        qh = tl.load(row + 128 + half * 32 + (s % 2) * 16 + t).to(tl.int32)
        qh = (qh >> (2 * (s8 // 2))) & 3
        q = ((ql | (qh << 4)) - 32).to(tl.float32)  # [R, 16, 16]
        dots = tl.sum(q * tl.load(x + s * 16 + t).to(tl.float32), axis=2)  # [R, 16]
        sc = tl.load(blk[:, None] + 192 + tl.arange(0, 16)[None, :]).to(tl.int8, bitcast=True).to(tl.float32)
        return _f16_at(blk + 208) * tl.sum(sc * dots, axis=1)
    # Q4_K, Q5_K: d, dmin, 12 bytes of scales and mins, (Q5_K: qh[32],) qs[128]. qs byte 32 g + w
    # holds value 64 g + w (low nibble, sub-block 2 g) and 64 g + 32 + w (high, sub-block 2 g + 1)
    g = tl.arange(0, 4)[None, :, None]
    w = tl.arange(0, 32)[None, None, :]
    qs_at: tl.constexpr = 16 if KIND == 0 else 48
    q = tl.load(row + qs_at + g * 32 + w).to(tl.int32)  # [R, 4, 32]
    low, high = q & 0xF, q >> 4
    if KIND == 1:  # the fifth bit of value 32 j + w is bit j of qh[w]
        qh = tl.load(row + 16 + w).to(tl.int32)  # [R, 1, 32]
        low = low | (((qh >> (2 * g)) & 1) << 4)
        high = high | (((qh >> (2 * g + 1)) & 1) << 4)
    x_low = tl.load(x + g * 64 + w).to(tl.float32)  # [1, 4, 32]
    x_high = tl.load(x + g * 64 + 32 + w).to(tl.float32)
    dot_low = tl.sum(low.to(tl.float32) * x_low, axis=2)  # [R, 4]
    dot_high = tl.sum(high.to(tl.float32) * x_high, axis=2)
    j = 2 * tl.arange(0, 4)[None, :]
    sc_low, mn_low = _scale_min_k4(blk[:, None], j)  # [R, 4]
    sc_high, mn_high = _scale_min_k4(blk[:, None], j + 1)
    scaled = tl.sum(sc_low * dot_low + sc_high * dot_high, axis=1)
    offsets = tl.sum(mn_low * tl.sum(x_low, axis=2) + mn_high * tl.sum(x_high, axis=2), axis=1)
    return _f16_at(blk) * scaled - _f16_at(blk + 2) * offsets


MXFP4 = 4  # (block_gemv only: 32-value blocks, so rows need not be whole 256-value super-blocks)
MXFP4_BLOCK_BYTES = 17  # an e8m0 exponent byte, then 16 bytes of e2m1 nibbles (value j low, j + 16 high)


@triton.jit
def _e2m1(n):
    """e2m1 nibbles -> float32: magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6 (bit 3 the sign)."""
    m = n & 7
    magnitude = tl.where(m < 4, m.to(tl.float32) * 0.5,
                         tl.where((m & 1) == 1, 3.0, 2.0) * tl.where(m >= 6, 2.0, 1.0))
    return tl.where((n & 8) != 0, -magnitude, magnitude)


@triton.jit
def mxfp4_step_dot(row, x, step, NUM_BLOCKS: tl.constexpr):
    """Rows' MXFP4 blocks step * 8 .. step * 8 + 7 (those below NUM_BLOCKS) at byte pointers `row`
    [R] (each row's first block) times the inputs at `x` (the row's first value): float32 [R]. A
    block is E2M1[nibble] x 2^(e - 127) (ggml's e8m0_to_fp32_half times its doubled values), its
    exponent applied once to the dot of its 32 values."""
    i = step * 8 + tl.arange(0, 8)[None, :, None]  # [1, 8, 1]: block index within the row
    j = tl.arange(0, 16)[None, None, :]
    present = i < NUM_BLOCKS
    at = row[:, None, None] + i * 17
    q = tl.load(at + 1 + j, mask=present, other=0).to(tl.int32)  # [R, 8, 16]
    x_low = tl.load(x + i * 32 + j, mask=present, other=0.0).to(tl.float32)  # [1, 8, 16]
    x_high = tl.load(x + i * 32 + 16 + j, mask=present, other=0.0).to(tl.float32)
    dots = tl.sum(_e2m1(q & 0xF) * x_low + _e2m1(q >> 4) * x_high, axis=2)  # [R, 8]
    blocks = step * 8 + tl.arange(0, 8)[None, :]  # [1, 8]
    e = tl.load(row[:, None] + blocks * 17, mask=blocks < NUM_BLOCKS, other=127).to(tl.float32)  # [R, 8]
    return tl.sum(tl.exp2(e - 127.0) * dots, axis=1)
