"""The torch twin of grouped_fp8_experts.py (a prompt chunk's block-scaled FP8 experts as two
grouped GEMMs, each weight tile times its block scale in registers): each expert's parts widened
as records.dequantize_fp8 does (the FP8 value times its float32 scale) and rounded to the compute
dtype, then grouped_experts_ref's arithmetic. The kernel matches it up to fp32 summation order. It
also holds what the kernel and its callers share: the FP8 types it reads and the argument checks."""

from __future__ import annotations

import torch

from .grouped_experts_ref import swiglu_groups

FP8_KINDS = {"f8_e4m3": torch.float8_e4m3fn, "f8_e5m2": torch.float8_e5m2}  # fp8_gemv.KINDS, without triton
Fp8Part = tuple[int, int]  # the weight's byte offset within a record row, and its float32 scales'
TILE = 64  # the kernel's BLOCK_N and BLOCK_K: H and I are whole tiles


def scale_shape(rows: int, cols: int, block: tuple[int, int]) -> tuple[int, int]:
    """The float32 scales of a [rows, cols] weight in `block` blocks: one a block, row-major."""
    return -(-rows // block[0]), -(-cols // block[1])


def check_fp8_args(x: torch.Tensor, records: torch.Tensor, gate: Fp8Part, up: Fp8Part, down: Fp8Part, hidden: int,
                   inter: int, kind: str, block: tuple[int, int], out: torch.Tensor) -> None:
    if x.dtype not in (torch.bfloat16, torch.float16) or x.dim() != 2 or x.shape[1] != hidden or x.stride(1) != 1:
        raise ValueError(f"x is [T, {hidden}] bf16 or f16 (its rows contiguous), not {list(x.shape)} {x.dtype}")
    if records.dtype != torch.uint8 or records.dim() != 2 or records.stride(1) != 1 or records.stride(0) % 4:
        raise ValueError("records are a uint8 [rows, bytes] tensor, its rows' bytes contiguous and 4-byte aligned")
    if kind not in FP8_KINDS:
        raise ValueError(f"the FP8 kernel reads {', '.join(FP8_KINDS)}, not {kind}")
    if hidden % TILE or inter % TILE:
        raise ValueError(f"the FP8 kernel reads whole {TILE}-value tiles, not H {hidden}, I {inter}")
    for name, (offset, scales), rows, cols in (("gate", gate, inter, hidden), ("up", up, inter, hidden),
                                               ("down", down, hidden, inter)):
        scale_rows, scale_cols = scale_shape(rows, cols, block)
        if offset < 0 or offset + rows * cols > records.shape[1] or scales % 4 or scales < 0 \
                or scales + 4 * scale_rows * scale_cols > records.shape[1]:
            raise ValueError(f"the {name} weight at byte {offset} or its scales at byte {scales} do not fit a "
                             f"{records.shape[1]}-byte record row (scales 4-byte aligned)")
    if out.dtype != torch.float32 or tuple(out.shape) != tuple(x.shape):
        raise ValueError(f"out is fp32 [{x.shape[0]}, {hidden}], not {list(out.shape)} {out.dtype}")


def fp8_weight(records: torch.Tensor, row: int, part: Fp8Part, shape: tuple[int, int], kind: str,
               block: tuple[int, int]) -> torch.Tensor:
    """Record `row`'s FP8 weight of `shape` at `part`, float32: each value times its block's scale."""
    (offset, scales), (rows, cols) = part, shape
    raw = records[row, offset: offset + rows * cols].view(FP8_KINDS[kind]).view(rows, cols).to(torch.float32)
    scale_rows, scale_cols = scale_shape(rows, cols, block)
    scale = records[row, scales: scales + 4 * scale_rows * scale_cols].view(torch.float32).view(scale_rows, scale_cols)
    return raw * scale.repeat_interleave(block[0], 0).repeat_interleave(block[1], 1)[:rows, :cols]


def grouped_fp8_experts_ref(x: torch.Tensor, records: torch.Tensor, *, gate: Fp8Part, up: Fp8Part, down: Fp8Part,
                            hidden: int, inter: int, kind: str, block: tuple[int, int], rows: torch.Tensor,
                            starts: torch.Tensor, counts: torch.Tensor, tokens: torch.Tensor,
                            pair_weights: torch.Tensor, max_count: int, out: torch.Tensor) -> None:
    """grouped_fp8_experts.grouped_fp8_experts, expert by expert (one host sync for the plan's lists)."""
    check_fp8_args(x, records, gate, up, down, hidden, inter, kind, block, out)

    def weight(row: int, part: Fp8Part, shape: tuple[int, int]) -> torch.Tensor:
        return fp8_weight(records, row, part, shape, kind, block).to(x.dtype).float()

    def expert(row: int) -> tuple[torch.Tensor, torch.Tensor]:
        w13 = torch.cat([weight(row, gate, (inter, hidden)), weight(row, up, (inter, hidden))])  # [2I, H]
        return w13, weight(row, down, (hidden, inter))

    swiglu_groups(x, expert, rows, starts, counts, tokens, pair_weights, out)
