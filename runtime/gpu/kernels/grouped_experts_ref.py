"""The torch twin of grouped_experts.py (a prompt chunk's experts as two grouped GEMMs), with its
arithmetic: products accumulated in fp32, the activation silu(g) * u rounded to the compute dtype
once, the down product in fp32 times the pair's routing weight, summed into fp32 outputs. The
kernel matches it up to fp32 summation order. It also holds what the kernel and its callers share:
the argument checks and the tile height; and the arithmetic expert by expert (`swiglu_groups`),
which grouped_block_experts_ref shares."""

from __future__ import annotations

from collections.abc import Callable

import torch


def tile_rows(mean_pairs: float) -> int:
    """The kernels' BLOCK_M for experts of `mean_pairs` pairs each on average: the smallest of 16,
    32 and 64 that holds them (fewer wasted rows in a tile; tl.dot needs at least 16)."""
    for rows in (16, 32):
        if mean_pairs <= rows:
            return rows
    return 64


def check_grouped_args(x: torch.Tensor, records: torch.Tensor, w13_offset: int, w2_offset: int, hidden: int,
                       inter: int, out: torch.Tensor) -> None:
    if x.dtype not in (torch.bfloat16, torch.float16) or x.dim() != 2 or x.shape[1] != hidden:
        raise ValueError(f"x is [T, {hidden}] bf16 or f16, not {list(x.shape)} {x.dtype}")
    if records.dtype != torch.uint8 or records.dim() != 2 or records.stride(1) != 1:
        raise ValueError("records are a uint8 [rows, bytes] tensor, its rows' bytes contiguous")
    esize = x.element_size()
    end = max(w13_offset + 2 * inter * hidden * esize, w2_offset + hidden * inter * esize)
    if w13_offset % esize or w2_offset % esize or records.shape[1] % esize or records.stride(0) % esize \
            or end > records.shape[1]:
        raise ValueError(f"the weights at byte offsets {w13_offset} and {w2_offset} do not fit {esize}-byte "
                         f"elements of a {records.shape[1]}-byte record row")
    if out.dtype != torch.float32 or tuple(out.shape) != tuple(x.shape):
        raise ValueError(f"out is fp32 [{x.shape[0]}, {hidden}], not {list(out.shape)} {out.dtype}")


def grouped_experts_ref(x: torch.Tensor, records: torch.Tensor, *, w13_offset: int, w2_offset: int, hidden: int,
                        inter: int, rows: torch.Tensor, starts: torch.Tensor, counts: torch.Tensor,
                        tokens: torch.Tensor, pair_weights: torch.Tensor, max_count: int, out: torch.Tensor) -> None:
    """grouped_experts.grouped_experts, expert by expert (one host sync for the plan's lists)."""
    check_grouped_args(x, records, w13_offset, w2_offset, hidden, inter, out)
    esize = x.element_size()
    weights = records.view(x.dtype)
    w13_at, w2_at = w13_offset // esize, w2_offset // esize

    def expert(row: int) -> tuple[torch.Tensor, torch.Tensor]:
        return (weights[row, w13_at: w13_at + 2 * inter * hidden].view(2 * inter, hidden).float(),
                weights[row, w2_at: w2_at + hidden * inter].view(hidden, inter).float())

    swiglu_groups(x, expert, rows, starts, counts, tokens, pair_weights, out)


def swiglu_groups(x: torch.Tensor, expert: Callable[[int], tuple[torch.Tensor, torch.Tensor]], rows: torch.Tensor,
                  starts: torch.Tensor, counts: torch.Tensor, tokens: torch.Tensor, pair_weights: torch.Tensor,
                  out: torch.Tensor, *, activation: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
                  biases: Callable[[int], tuple[torch.Tensor, torch.Tensor]] | None = None) -> None:
    """The twins' arithmetic, expert by expert: `expert(row)` gives the record's (w13 [2I, H], w2
    [H, I]) as float32 holding values of the compute dtype (x's); `activation(gate, up)` in fp32
    (None: silu(gate) * up) is rounded to the compute dtype once; `biases(row)`, where the records
    have them, the float32 (w13 bias [2I], w2 bias [H]) added to the fp32 sums."""
    for row, start, count in zip(rows.tolist(), starts.tolist(), counts.tolist(), strict=True):
        if count == 0:
            continue
        w13, w2 = expert(row)
        inter = w2.shape[1]
        picked = tokens[start: start + count]
        bias13, bias2 = biases(row) if biases is not None else (0.0, 0.0)
        h = x[picked].float() @ w13.T + bias13  # [count, 2I]
        gate, up = h[:, :inter], h[:, inter:]
        act = (gate * torch.sigmoid(gate) * up if activation is None else activation(gate, up)).to(x.dtype)
        y = (act.float() @ w2.T + bias2) * pair_weights[start: start + count, None].float()
        out.index_add_(0, picked, y)
