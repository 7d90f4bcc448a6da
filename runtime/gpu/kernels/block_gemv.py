"""Triton kernel: rows of GGML block-quant weights times a vector, read in place from expert-cache
slots and dequantized in registers (a GGUF model's decode experts: Q4_K_M's Q4_K and Q6_K, Q5_K_M's
Q5_K, Q8_0; gpt-oss's MXFP4, whose rows of 32-value blocks need not be whole super-blocks).

`block_gemv` computes, for every pair p whose slot is not -1,

    out[p, r] = sum_c W_p[r, c] * inputs[index[p], c]      (r < rows, c < cols)

where W_p is the weight part at `part_offset` of the record in slot p's slot: `rows` GGML rows of
`cols` values, each row cols / 256 super-blocks of `block_bytes` (Q8_0: eight of its 32-value
blocks). Grid (rows / BLOCK_R, pairs): a program takes SPAN super-blocks of each of its rows side by
side (a decode GEMV is too short to hide a load's latency one super-block after another) and adds
each one's dot with the input's 256 values in float32 (`ggml_dequant.super_block_dot`: a sub-block's scale and
min applied once to the dot of its integer quants, not to each value as the weights' values
would be; `ggml_blocks.py` is the torch form of those values the tests hold it to). A pair the route plan left to the
CPU (slot -1) stores zeros. No weight is copied or widened in memory: a Q4_K record is read as its
2.7 MB, where the gather path dequantized it into a 9.4 MB bf16 copy first.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .ggml_dequant import KINDS as SUPER_BLOCK_KINDS
from .ggml_dequant import (
    MXFP4,
    MXFP4_BLOCK_BYTES,
    Q4_K,
    Q5_K,
    Q6_K,
    Q8_0,
    SUPER_BLOCK_BYTES,
    mxfp4_step_dot,
    super_block_dot,
)

KINDS = {**SUPER_BLOCK_KINDS, "mxfp4": MXFP4}  # what block_gemv reads in place
WORD_BYTES = {Q4_K: 4, Q5_K: 4, Q6_K: 2, Q8_0: 2, MXFP4: 1}  # the width super_block_dot reads, its alignment
VALUES_PER_BLOCK = {**{kind: 256 for kind in SUPER_BLOCK_KINDS}, "mxfp4": 32}  # a row is a whole number of these



def default_tile(code: int, cols: int) -> tuple[int, int, int]:
    """(rows a program, super-blocks of a row side by side, warps) for `code` rows of `cols` values,
    the fastest of benchmarks/bench_block_gemv.py's sweep on an H100 (2026-12-07, device time of
    calls captured in a CUDA graph): Q4_K gate|up [8 x 1536, 2048] 11.5 us (32, 4, 8) where the
    previous kernel's 16 rows a program one super-block after another took 75.0; Q6_K down
    [8 x 2048, 768] 10.6 us (16, 1, 4: its halfword form spills at wider spans), 12.1 before; MXFP4
    (eight blocks a step whatever the span) 66.6 us at (8, 1, 2), 88.0 before."""
    if code == MXFP4:
        return 8, 1, 2
    if code in (Q4_K, Q5_K):
        return 32, min(4, triton.next_power_of_2(cols // 256)), 8
    return 16, 1, 4  # Q6_K, Q8_0


@triton.jit
def _block_gemv_kernel(in_ptr, stride_in, index_ptr, slots_ptr, stride_slot, part_offset, slot_of_ptr, out_ptr,
                       stride_out, ROWS: tl.constexpr, COLS: tl.constexpr, KIND: tl.constexpr,
                       SB_BYTES: tl.constexpr, ROW_BYTES: tl.constexpr, BLOCK_R: tl.constexpr,
                       SPAN: tl.constexpr):
    p = tl.program_id(1)
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    mask_r = rows < ROWS
    slot = tl.load(slot_of_ptr + p)
    if slot < 0:
        tl.store(out_ptr + p * stride_out + rows, tl.zeros((BLOCK_R,), dtype=tl.float32), mask=mask_r)
        return
    src = in_ptr + tl.load(index_ptr + p).to(tl.int64) * stride_in
    safe_rows = tl.where(mask_r, rows, 0).to(tl.int64)  # (masked rows read row 0: a record's own bytes)
    base = slots_ptr + slot.to(tl.int64) * stride_slot + part_offset + safe_rows * ROW_BYTES
    acc = tl.zeros((BLOCK_R,), dtype=tl.float32)
    if KIND == 4:  # MXFP4: 32-value blocks, eight at a time, the last step masked
        for step in range(0, (COLS // 32 + 7) // 8):
            acc += mxfp4_step_dot(base, src, step, COLS // 32)
    else:  # SPAN super-blocks of each row side by side (the last span's spare ones read the row's last, unused)
        num_blocks: tl.constexpr = COLS // 256
        for first in range(0, num_blocks, SPAN):
            at = first + tl.arange(0, SPAN)[None, :]  # [1, SPAN]
            block = tl.minimum(at, num_blocks - 1)
            dots = super_block_dot(base[:, None] + block * SB_BYTES, src + block * 256, KIND)  # [BLOCK_R, SPAN]
            acc += tl.sum(tl.where(at < num_blocks, dots, 0.0), axis=1)
    tl.store(out_ptr + p * stride_out + rows, acc.to(out_ptr.dtype.element_ty), mask=mask_r)


def block_gemv(inputs: torch.Tensor, index: torch.Tensor, slots: torch.Tensor, slot_of: torch.Tensor, *,
               part_offset: int, kind: str, rows: int, cols: int,
               tile: tuple[int, int, int] | None = None, out_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """`out_dtype` [P, rows] (summed in float32, rounded once at the store): pair p's weight part (`kind` blocks at `part_offset` of slot slot_of[p]'s
    record) times inputs[index[p]] (inputs [N, cols], any float dtype); zeros where slot_of[p] < 0.
    `index` and `slot_of` int32 [P] on the slots' device; `tile` (rows a program, super-blocks side
    by side, warps) overrides `default_tile`."""
    if kind not in KINDS:
        raise ValueError(f"block_gemv reads {', '.join(sorted(KINDS))}, not {kind}")
    code, per_block = KINDS[kind], VALUES_PER_BLOCK[kind]
    if cols % per_block or inputs.dim() != 2 or inputs.shape[1] != cols or inputs.stride(1) != 1:
        raise ValueError(f"block_gemv: inputs are [N, {cols}] with cols a multiple of {per_block}, not "
                         f"{list(inputs.shape)}")
    row_bytes = cols // 32 * MXFP4_BLOCK_BYTES if code == MXFP4 else cols // 256 * SUPER_BLOCK_BYTES[code]
    if slots.dtype != torch.uint8 or slots.dim() != 2 or slots.stride(1) != 1 \
            or part_offset + rows * row_bytes > slots.shape[1]:
        raise ValueError(f"block_gemv: the {kind} part at byte {part_offset} ({rows} x {cols}) does not fit a "
                         f"{slots.shape[1]}-byte slot")
    width = WORD_BYTES[code]
    if (slots.data_ptr() | slots.stride(0) | part_offset | row_bytes) % width:
        raise ValueError(f"block_gemv reads {kind} rows as {width}-byte words: the slots (stride {slots.stride(0)}) "
                         f"and the part at byte {part_offset} must be {width}-byte aligned (FTW aligns parts to 256)")
    pairs = slot_of.numel()
    out = torch.empty(pairs, rows, dtype=out_dtype, device=slots.device)
    if pairs == 0:
        return out
    block_r, span, num_warps = tile or default_tile(code, cols)
    _block_gemv_kernel[(triton.cdiv(rows, block_r), pairs)](  # (rows first: an output head's tiles pass 65,535)
        inputs, inputs.stride(0), index, slots, slots.stride(0), part_offset, slot_of, out, out.stride(0),
        ROWS=rows, COLS=cols, KIND=code, SB_BYTES=SUPER_BLOCK_BYTES.get(code, 0), ROW_BYTES=row_bytes, BLOCK_R=block_r,
        SPAN=span, num_warps=num_warps)
    return out


# (tokens, device) -> (each token its own pair, every pair slot 0): a dense product's constant
# indices, made once (two kernels a call were 4% of a Q4_K_M decode step's device time: 65 calls)
_DENSE_PAIRS: dict[tuple[int, torch.device], tuple[torch.Tensor, torch.Tensor]] = {}


def _dense_pairs(tokens: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    pairs = _DENSE_PAIRS.get((tokens, device))
    if pairs is None:
        index = torch.arange(tokens, dtype=torch.int32, device=device)
        pairs = _DENSE_PAIRS[tokens, device] = (index, torch.zeros_like(index))
    return pairs


def dense_block_gemv(x: torch.Tensor, data: torch.Tensor, *, kind: str, rows: int, cols: int,
                     out_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """`out_dtype` [T, rows]: x [T, cols] times one dense weight stored as `kind` GGML rows (`data`
    uint8 [rows, row bytes], a GGUF model's projection: runtime/layers/block_weight.py), read in
    place: `block_gemv` with the weight as one slot's record and each token a pair. The pair
    indices are made once per token count (a CUDA graph replays them: they are never written)."""
    index, slot_of = _dense_pairs(x.shape[0], x.device)
    return block_gemv(x.contiguous(), index, data.reshape(1, -1), slot_of, part_offset=0, kind=kind,
                      rows=rows, cols=cols, out_dtype=out_dtype)
