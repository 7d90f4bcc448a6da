"""The torch twin of grouped_mxfp4_experts.py (a prompt chunk's MXFP4 experts, gpt-oss's, as two
grouped GEMMs with the records' biases and activation): each expert's parts dequantized as gguf-py
does (runtime/experts/ggml_blocks.py) and rounded to the compute dtype, then grouped_experts_ref's
arithmetic (swiglu_groups) with the biases and the bank's activation (slot_experts_ref.activation_ref). The kernel matches it up to fp32 summation order. It also holds what the kernel and its
callers share: the argument checks."""

from __future__ import annotations

import torch

from ftw.format import BLOCK_DTYPES

from ...experts.ggml_blocks import dequantize_blocks
from .grouped_experts_ref import swiglu_groups
from .slot_experts_ref import ACTIVATIONS, activation_ref

BIAS_KINDS = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}
GATED_ACTS = ("swiglu", "swiglu_limited", "swiglu_clamped")  # what the kernel computes (gate rows, then up rows)
BLOCK_BYTES = BLOCK_DTYPES["mxfp4"][1]  # 17: an e8m0 exponent byte, 16 bytes of e2m1 nibbles, for 32 values


def mxfp4_bytes(rows: int, cols: int) -> int:
    return rows * cols // 32 * BLOCK_BYTES


def check_mxfp4_args(x: torch.Tensor, records: torch.Tensor, *, w13_at: int, w2_at: int, w13_bias_at: int,
                     w2_bias_at: int, bias_kind: str | None, hidden: int, inter: int, act: str,
                     out: torch.Tensor) -> None:
    if x.dtype not in (torch.bfloat16, torch.float16) or x.dim() != 2 or x.shape[1] != hidden or x.stride(1) != 1:
        raise ValueError(f"x is [T, {hidden}] bf16 or f16 (its rows contiguous), not {list(x.shape)} {x.dtype}")
    if records.dtype != torch.uint8 or records.dim() != 2 or records.stride(1) != 1 or records.stride(0) % 4:
        raise ValueError("records are a uint8 [rows, bytes] tensor, its rows' bytes contiguous and 4-byte aligned")
    if hidden % 32 or inter % 32:
        raise ValueError(f"MXFP4 rows are whole 32-value blocks, not H {hidden}, I {inter}")
    if act not in GATED_ACTS:
        raise ValueError(f"the MXFP4 kernel computes {', '.join(GATED_ACTS)}, not {act}")
    parts = [("w13", w13_at, mxfp4_bytes(2 * inter, hidden)), ("w2", w2_at, mxfp4_bytes(hidden, inter))]
    if bias_kind is not None:
        if bias_kind not in BIAS_KINDS:
            raise ValueError(f"the MXFP4 kernel reads biases of {', '.join(BIAS_KINDS)}, not {bias_kind}")
        size = BIAS_KINDS[bias_kind].itemsize
        parts += [("w13_bias", w13_bias_at, 2 * inter * size), ("w2_bias", w2_bias_at, hidden * size)]
        if w13_bias_at % size or w2_bias_at % size:
            raise ValueError(f"the biases at bytes {w13_bias_at} and {w2_bias_at} are not {size}-byte aligned")
    for name, at, nbytes in parts:
        if at < 0 or at + nbytes > records.shape[1]:
            raise ValueError(f"the {name} part at byte {at} does not fit a {records.shape[1]}-byte record row")
    if out.dtype != torch.float32 or tuple(out.shape) != tuple(x.shape):
        raise ValueError(f"out is fp32 [{x.shape[0]}, {hidden}], not {list(out.shape)} {out.dtype}")


def grouped_mxfp4_experts_ref(x: torch.Tensor, records: torch.Tensor, *, w13_at: int, w2_at: int, w13_bias_at: int,
                              w2_bias_at: int, bias_kind: str | None, hidden: int, inter: int, act: str,
                              alpha: float, limit: float, rows: torch.Tensor, starts: torch.Tensor,
                              counts: torch.Tensor, tokens: torch.Tensor, pair_weights: torch.Tensor,
                              max_count: int, out: torch.Tensor) -> None:
    """grouped_mxfp4_experts.grouped_mxfp4_experts, expert by expert (one host sync for the plan's lists)."""
    check_mxfp4_args(x, records, w13_at=w13_at, w2_at=w2_at, w13_bias_at=w13_bias_at, w2_bias_at=w2_bias_at,
                     bias_kind=bias_kind, hidden=hidden, inter=inter, act=act, out=out)

    def weight(row: int, at: int, shape: tuple[int, int]) -> torch.Tensor:
        raw = records[row: row + 1, at: at + mxfp4_bytes(*shape)]
        return dequantize_blocks(raw, "mxfp4", shape)[0].to(x.dtype).float()

    def expert(row: int) -> tuple[torch.Tensor, torch.Tensor]:
        return weight(row, w13_at, (2 * inter, hidden)), weight(row, w2_at, (hidden, inter))

    def biases(row: int) -> tuple[torch.Tensor, torch.Tensor]:
        kind = BIAS_KINDS[bias_kind]
        return tuple(records[row, at: at + size * kind.itemsize].view(kind).float()
                     for at, size in ((w13_bias_at, 2 * inter), (w2_bias_at, hidden)))

    swiglu_groups(x, expert, rows, starts, counts, tokens, pair_weights, out,
                  activation=lambda gate, up: activation_ref(gate, up, ACTIVATIONS[act], alpha, limit),
                  biases=biases if bias_kind is not None else None)
