"""The torch twin of grouped_block_experts.py (a prompt chunk's GGUF experts as two grouped GEMMs,
the block-quant weights dequantized per tile): each expert's parts dequantized as gguf-py does
(runtime/experts/ggml_blocks.py) and rounded to the compute dtype, then grouped_experts_ref's
arithmetic. The kernel matches it up to fp32 summation order. It also holds what the kernel and
its callers share: the GGML types it reads, the bytes of a part, the argument checks."""

from __future__ import annotations

import torch

from ftw.format import BLOCK_DTYPES

from ...experts.ggml_blocks import dequantize_blocks
from .grouped_experts_ref import swiglu_groups

BLOCK_KINDS = ("q4_k", "q5_k", "q6_k", "q8_0")  # ggml_dequant.KINDS (the kernel's), without triton
Part = tuple[int, str]  # a weight's byte offset within a record row, and its GGML type


def part_bytes(kind: str, rows: int, cols: int) -> int:
    """Bytes of `rows` GGML rows of `cols` values of type `kind`."""
    block_size, type_size = BLOCK_DTYPES[kind]
    return rows * (cols // block_size) * type_size


def check_block_args(x: torch.Tensor, records: torch.Tensor, gate: Part, up: Part, down: Part, hidden: int,
                     inter: int, out: torch.Tensor) -> None:
    if x.dtype not in (torch.bfloat16, torch.float16) or x.dim() != 2 or x.shape[1] != hidden or x.stride(1) != 1:
        raise ValueError(f"x is [T, {hidden}] bf16 or f16 (its rows contiguous), not {list(x.shape)} {x.dtype}")
    if records.dtype != torch.uint8 or records.dim() != 2 or records.stride(1) != 1:
        raise ValueError("records are a uint8 [rows, bytes] tensor, its rows' bytes contiguous")
    if hidden % 256 or inter % 256:
        raise ValueError(f"the block kernel reads rows of whole 256-value super-blocks, not H {hidden}, I {inter}")
    for name, (offset, kind), rows, cols in (("gate", gate, inter, hidden), ("up", up, inter, hidden),
                                             ("down", down, hidden, inter)):
        if kind not in BLOCK_KINDS:
            raise ValueError(f"the block kernel reads {', '.join(BLOCK_KINDS)}, not {kind} ({name})")
        if offset < 0 or offset + part_bytes(kind, rows, cols) > records.shape[1]:
            raise ValueError(f"the {kind} {name} weight at byte {offset} does not fit a {records.shape[1]}-byte "
                             "record row")
    if out.dtype != torch.float32 or tuple(out.shape) != tuple(x.shape):
        raise ValueError(f"out is fp32 [{x.shape[0]}, {hidden}], not {list(out.shape)} {out.dtype}")


def grouped_block_experts_ref(x: torch.Tensor, records: torch.Tensor, *, gate: Part, up: Part, down: Part,
                              hidden: int, inter: int, rows: torch.Tensor, starts: torch.Tensor,
                              counts: torch.Tensor, tokens: torch.Tensor, pair_weights: torch.Tensor,
                              max_count: int, out: torch.Tensor) -> None:
    """grouped_block_experts.grouped_block_experts, expert by expert (one host sync for the plan's lists)."""
    check_block_args(x, records, gate, up, down, hidden, inter, out)

    def weight(row: int, part: Part, shape: tuple[int, int]) -> torch.Tensor:
        offset, kind = part
        raw = records[row: row + 1, offset: offset + part_bytes(kind, *shape)]
        return dequantize_blocks(raw, kind, shape)[0].to(x.dtype).float()

    def expert(row: int) -> tuple[torch.Tensor, torch.Tensor]:
        w13 = torch.cat([weight(row, gate, (inter, hidden)), weight(row, up, (inter, hidden))])  # [2I, H]
        return w13, weight(row, down, (hidden, inter))

    swiglu_groups(x, expert, rows, starts, counts, tokens, pair_weights, out)
