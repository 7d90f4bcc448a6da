"""Triton kernel: rows of block-scaled FP8 weights times a vector, read in place from expert-cache
slots (the FP8 checkpoints of DeepSeek, Qwen and GLM: e4m3 weights, one float32 scale per 128 x 128
block, `weight_scale_inv`).

`fp8_gemv` computes, for every pair p whose slot is not -1,

    out[p, r] = sum_c fp8(W_p[r, c]) * scale_p[r // BR, c // BC] * inputs[index[p], c]

where W_p is `rows` x `cols` bytes at `part_offset` of slot slot_of[p]'s record and its scales a
row-major float32 [ceil(rows / BR), ceil(cols / BC)] at `scale_offset`. A program takes BLOCK_R rows
and walks the columns a scale block at a time: its bytes decoded to float32 with integer ops (sign,
exponent and mantissa placed in a float32's bits: exact, subnormals and NaN included, and no FP8
type needed, so the interpreter runs it too), times the block's scale, against the input's values.
This is the value records.dequantize_fp8 makes (`w.to(float32) * scale`), multiplied where it lies:
a record is read as its 1 byte a weight, where the gather path widened it into a bf16 copy first.
A pair the route plan left to the CPU (slot -1) stores zeros.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

E4M3, E5M2 = 0, 1
KINDS = {"f8_e4m3": E4M3, "f8_e5m2": E5M2}


@triton.jit
def _fp8_to_f32(b, KIND: tl.constexpr):
    """FP8 bytes (int32 0..255) -> their float32 values: e4m3fn (bias 7, no infinities, S.1111.111 NaN)
    or e5m2 (bias 15, IEEE-like)."""
    sign = (b >> 7) & 1
    if KIND == 0:
        e, m = (b >> 3) & 15, b & 7
        normal = ((sign << 31) | ((e + 120) << 23) | (m << 20)).to(tl.float32, bitcast=True)
        subnormal = m.to(tl.float32) * 0.001953125  # m / 8 * 2^-6
        value = tl.where(e == 0, tl.where(sign == 1, -subnormal, subnormal), normal)
        return tl.where((e == 15) & (m == 7), float("nan"), value)
    e, m = (b >> 2) & 31, b & 3
    normal = ((sign << 31) | ((e + 112) << 23) | (m << 21)).to(tl.float32, bitcast=True)
    subnormal = m.to(tl.float32) * 0.0000152587890625  # m / 4 * 2^-14
    value = tl.where(e == 0, tl.where(sign == 1, -subnormal, subnormal), normal)
    special = tl.where(m == 0, float("inf"), float("nan"))
    return tl.where(e == 31, tl.where(sign == 1, -special, special), value)


@triton.jit
def _fp8_gemv_kernel(in_ptr, stride_in, index_ptr, slots_ptr, stride_slot, part_offset, scale_offset, slot_of_ptr,
                     out_ptr, stride_out, ROWS: tl.constexpr, COLS: tl.constexpr, SCALE_ROWS: tl.constexpr,
                     SCALE_COLS: tl.constexpr, KIND: tl.constexpr, BLOCK_R: tl.constexpr):
    p = tl.program_id(0)
    rows = tl.program_id(1) * BLOCK_R + tl.arange(0, BLOCK_R)
    mask_r = rows < ROWS
    slot = tl.load(slot_of_ptr + p)
    if slot < 0:
        tl.store(out_ptr + p * stride_out + rows, tl.zeros((BLOCK_R,), dtype=tl.float32), mask=mask_r)
        return
    src = in_ptr + tl.load(index_ptr + p).to(tl.int64) * stride_in
    record = slots_ptr + slot.to(tl.int64) * stride_slot
    weights = record + part_offset + rows.to(tl.int64)[:, None] * COLS  # [BLOCK_R, 1]
    scale_cols: tl.constexpr = (COLS + SCALE_COLS - 1) // SCALE_COLS
    scales = (record + scale_offset).to(tl.pointer_type(tl.float32)) + (rows // SCALE_ROWS)[:, None] * scale_cols
    c = tl.arange(0, SCALE_COLS)
    acc = tl.zeros((BLOCK_R,), dtype=tl.float32)
    for c0 in range(0, COLS, SCALE_COLS):
        cols = c0 + c
        mask_c = cols < COLS
        xs = tl.load(src + cols, mask=mask_c, other=0.0).to(tl.float32)
        raw = tl.load(weights + cols[None, :], mask=mask_r[:, None] & mask_c[None, :], other=0).to(tl.int32)
        scale = tl.load(scales + c0 // SCALE_COLS, mask=mask_r[:, None], other=0.0)  # [BLOCK_R, 1]
        w = tl.where(mask_c[None, :], _fp8_to_f32(raw, KIND) * scale, 0.0)
        acc += tl.sum(w * xs[None, :], axis=1)
    tl.store(out_ptr + p * stride_out + rows, acc, mask=mask_r)


def fp8_gemv(inputs: torch.Tensor, index: torch.Tensor, slots: torch.Tensor, slot_of: torch.Tensor, *,
             part_offset: int, scale_offset: int, kind: str, rows: int, cols: int,
             block: tuple[int, int] = (128, 128)) -> torch.Tensor:
    """float32 [P, rows]: pair p's FP8 part (`kind` bytes [rows, cols] at `part_offset` of slot
    slot_of[p]'s record, float32 block scales at `scale_offset`, `block` = (rows, cols) a scale
    covers) times inputs[index[p]] (inputs [N, cols], any float dtype); zeros where slot_of[p] < 0.
    `index` and `slot_of` int32 [P] on the slots' device."""
    if kind not in KINDS:
        raise ValueError(f"fp8_gemv reads {', '.join(sorted(KINDS))}, not {kind}")
    if inputs.dim() != 2 or inputs.shape[1] != cols or inputs.stride(1) != 1:
        raise ValueError(f"fp8_gemv: inputs are [N, {cols}], not {list(inputs.shape)}")
    block_rows, block_cols = block
    if block_cols & (block_cols - 1) or block_cols < 16:
        raise ValueError(f"fp8_gemv: a scale block's columns are a power of two of at least 16, not {block_cols}")
    scales_bytes = 4 * -(-rows // block_rows) * -(-cols // block_cols)
    if slots.dtype != torch.uint8 or slots.dim() != 2 or slots.stride(1) != 1 or scale_offset % 4 \
            or max(part_offset + rows * cols, scale_offset + scales_bytes) > slots.shape[1]:
        raise ValueError(f"fp8_gemv: the {kind} part at byte {part_offset} ({rows} x {cols}) or its scales at "
                         f"{scale_offset} do not fit a {slots.shape[1]}-byte slot")
    pairs = slot_of.numel()
    out = torch.empty(pairs, rows, dtype=torch.float32, device=slots.device)
    if pairs == 0:
        return out
    block_r = 16
    _fp8_gemv_kernel[(pairs, triton.cdiv(rows, block_r))](
        inputs, inputs.stride(0), index, slots, slots.stride(0), part_offset, scale_offset, slot_of, out,
        out.stride(0), ROWS=rows, COLS=cols, SCALE_ROWS=block_rows, SCALE_COLS=block_cols, KIND=KINDS[kind],
        BLOCK_R=block_r, num_warps=4)
    return out
