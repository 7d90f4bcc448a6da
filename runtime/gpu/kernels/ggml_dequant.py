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
def _f16_bits(h):
    """float16 bit patterns in the low 16 bits of integers -> float32."""
    return (h & 0xFFFF).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _scale_min_words(s0, s1, s2, j):
    """Q4_K's and Q5_K's 6-bit scales and mins of sub-blocks `j` (0..7) from the three little-endian
    words s0, s1, s2 of their 12 scale bytes q[0..11]: j < 4: q[j] & 63 and q[j + 4] & 63; else
    (with i = j - 4) q[i + 8] & 15 | q[i] >> 6 << 4 and q[i + 8] >> 4 | q[i + 4] >> 6 << 4."""
    shift = 8 * (j % 4)
    a = (s0 >> shift) & 0xFF  # q[j % 4]
    b = (s1 >> shift) & 0xFF  # q[j % 4 + 4]
    c = (s2 >> shift) & 0xFF  # q[j % 4 + 8]
    low = j < 4
    sc = tl.where(low, a & 63, (c & 0xF) | ((a >> 6) << 4))
    mn = tl.where(low, b & 63, (c >> 4) | ((b >> 6) << 4))
    return sc.to(tl.float32), mn.to(tl.float32)


@triton.jit
def super_block_dot(blk, x, KIND: tl.constexpr):
    """Super-blocks at byte pointers `blk` [R, S] (row r's super-block s) times the 256 inputs each
    at `x` [1, S]: float32 [R, S]. A caller sums over S: a row's super-blocks are read side by
    side, not one after another, so a program keeps many loads in flight.

    A sub-block's scale (and min) is read and applied once, to the dot of its integer quants with
    its inputs, not to each value: for Q4_K and Q5_K, d * sum_j sc_j (q_j . x_j) - dmin * sum_j
    m_j sum(x_j); for Q6_K d * sum_s sc_s (q_s . x_s); for Q8_0 sum_i d_i (q_i . x_i). The bytes
    are read as wide words, each holding several values: Q4_K's and Q5_K's (144 and 176 bytes) as
    int32, so `blk` must be 4-byte aligned; Q6_K's and Q8_0's (210 and 34) as int16, 2-byte
    aligned. The values equal `dequant`'s up to float32 rounding."""
    xs = x[:, :, None, None]
    if KIND == 3:  # Q8_0: eight 34-byte blocks (17 halfwords), an fp16 scale then 32 int8
        half = blk.to(tl.pointer_type(tl.int16))
        i = tl.arange(0, 8)[None, None, :, None]
        m = tl.arange(0, 16)[None, None, None, :]
        h = tl.load(half[:, :, None, None] + i * 17 + 1 + m).to(tl.int32)  # [R, S, 8, 16]: int8 values 2 m, 2 m + 1
        at = xs + i * 32 + 2 * m
        dots = tl.sum(((h << 24) >> 24).to(tl.float32) * tl.load(at).to(tl.float32)
                      + ((h << 16) >> 24).to(tl.float32) * tl.load(at + 1).to(tl.float32), axis=3)  # [R, S, 8]
        d = _f16_bits(tl.load(half[:, :, None] + tl.arange(0, 8)[None, None, :] * 17).to(tl.int32))
        return tl.sum(d * dots, axis=2)
    if KIND == 2:  # Q6_K: ql[128], qh[64], int8 scales[16], d; value 128 h + 32 t + c (c < 32)
        # takes ql byte 64 h + 32 (t % 2) + c (nibble t // 2), qh byte 32 h + c (bits 2 t) and scale
        # 8 h + 2 t + c // 16. With c = 16 mh + 2 k + e (e a halfword's byte), a = 4 h + 2 (t % 2) + mh
        # indexes both the ql halfwords 8 a + k and, for t // 2 in 0 and 1, one scale per (a, t // 2).
        half = blk.to(tl.pointer_type(tl.int16))
        a = tl.arange(0, 8)[None, None, :, None]
        k = tl.arange(0, 8)[None, None, None, :]
        h, t_low, mh = a // 4, (a // 2) % 2, a % 2
        ql = tl.load(half[:, :, None, None] + 8 * a + k).to(tl.int32)  # [R, S, 8, 8]
        qh = tl.load(half[:, :, None, None] + 64 + 16 * h + 8 * mh + k).to(tl.int32)
        x_at = xs + 128 * h + 32 * t_low + 16 * mh + 2 * k  # (+ 64 for t // 2 = 1, + e)
        a3 = tl.arange(0, 8)[None, None, :]
        scale_at = blk[:, :, None] + 192 + 8 * (a3 // 4) + 2 * ((a3 // 2) % 2) + a3 % 2  # [R, S, 8]: 8 h + 2 t + mh
        total = tl.zeros(blk.shape, dtype=tl.float32)
        for t_high in tl.static_range(2):
            t = 2 * t_high + t_low
            acc = tl.zeros(ql.shape, dtype=tl.float32)
            for e in tl.static_range(2):
                q = ((ql >> (8 * e + 4 * t_high)) & 0xF) | ((((qh >> (8 * e)) >> (2 * t)) & 3) << 4)
                acc += (q - 32).to(tl.float32) * tl.load(x_at + 64 * t_high + e).to(tl.float32)
            sc = tl.load(scale_at + 4 * t_high).to(tl.int8, bitcast=True).to(tl.float32)
            total += tl.sum(sc * tl.sum(acc, axis=3), axis=2)
        return _f16_bits(tl.load(half + 104).to(tl.int32)) * total
    # Q4_K, Q5_K: d, dmin, 12 bytes of scales and mins, (Q5_K: qh[32],) qs[128]. qs byte 32 g + w
    # holds value 64 g + w (low nibble, sub-block 2 g) and 64 g + 32 + w (high, sub-block 2 g + 1);
    # it is byte b of word 8 g + k, w = 4 k + b
    words = blk.to(tl.pointer_type(tl.int32))
    row = words[:, :, None, None]
    g = tl.arange(0, 4)[None, None, :, None]
    k = tl.arange(0, 8)[None, None, None, :]
    qs_at: tl.constexpr = 4 if KIND == 0 else 12
    q = tl.load(row + qs_at + 8 * g + k)  # [R, S, 4, 8]
    if KIND == 1:  # the fifth bit of value 32 j + w is bit j of qh[w]: byte b of qh word k
        qh = tl.load(row + 4 + k)  # [R, S, 1, 8]
    x_at = xs + 64 * g + 4 * k
    acc_low = tl.zeros(q.shape, dtype=tl.float32)
    acc_high = tl.zeros(q.shape, dtype=tl.float32)
    sum_low = tl.zeros(x_at.shape, dtype=tl.float32)
    sum_high = tl.zeros(x_at.shape, dtype=tl.float32)
    for b in tl.static_range(4):
        low = (q >> (8 * b)) & 0xF
        high = (q >> (8 * b + 4)) & 0xF
        if KIND == 1:
            bits = qh >> (8 * b)
            low = low | (((bits >> (2 * g)) & 1) << 4)
            high = high | (((bits >> (2 * g + 1)) & 1) << 4)
        x_low = tl.load(x_at + b).to(tl.float32)  # [1, S, 4, 8]
        x_high = tl.load(x_at + 32 + b).to(tl.float32)
        acc_low += low.to(tl.float32) * x_low
        acc_high += high.to(tl.float32) * x_high
        sum_low += x_low
        sum_high += x_high
    d_dmin = tl.load(words)  # [R, S]: d | dmin << 16, then the scale words
    s0, s1, s2 = tl.load(words + 1)[:, :, None], tl.load(words + 2)[:, :, None], tl.load(words + 3)[:, :, None]
    j = 2 * tl.arange(0, 4)[None, None, :]
    sc_low, mn_low = _scale_min_words(s0, s1, s2, j)  # [R, S, 4]
    sc_high, mn_high = _scale_min_words(s0, s1, s2, j + 1)
    scaled = tl.sum(sc_low * tl.sum(acc_low, axis=3) + sc_high * tl.sum(acc_high, axis=3), axis=2)
    offsets = tl.sum(mn_low * tl.sum(sum_low, axis=3) + mn_high * tl.sum(sum_high, axis=3), axis=2)
    return _f16_bits(d_dmin) * scaled - _f16_bits(d_dmin >> 16) * offsets


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
