"""The expert-execution interface and the CPU executor (the miss path of the hybrid runtime)."""

from __future__ import annotations

from typing import Protocol

import torch
import torch.nn.functional as F

from .bank import HostExpertBank


class ExpertExecutor(Protocol):
    """Runs the routed experts of one MoE layer.

    `x` [T, H] are the tokens, `expert_ids` [T, K] int64 the experts each token was routed to,
    `weights` [T, K] their routing weights (already normalized/scaled as the family wants).
    Returns [T, H]: sum over k of weights[t, k] * expert_{ids[t, k]}(x[t]), in x's dtype.
    """

    def __call__(self, layer: int, x: torch.Tensor, expert_ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor: ...


class CPUExpertExecutor:
    """Experts computed on the CPU straight from the host banks, one expert at a time.

    Tokens are grouped by expert, so prefill runs each expert once as a matrix product. Banks
    in the compute dtype are used in place (no copy); others are converted per use.
    """

    def __init__(self, banks: dict[int, HostExpertBank], dtype: torch.dtype) -> None:
        self.banks = banks
        self.dtype = dtype

    def __call__(self, layer: int, x: torch.Tensor, expert_ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        bank = self.banks[layer]
        out = torch.zeros_like(x)
        flat_ids = expert_ids.reshape(-1)
        order = torch.argsort(flat_ids, stable=True)
        sorted_ids = flat_ids[order].tolist()
        token_of = order // expert_ids.shape[1]
        flat_weights = weights.reshape(-1)[order]
        start = 0
        while start < len(sorted_ids):
            expert = sorted_ids[start]
            end = start
            while end < len(sorted_ids) and sorted_ids[end] == expert:
                end += 1
            tokens = token_of[start:end]
            w13, w2 = bank.weights(expert, self.dtype)
            y = swiglu(x[tokens], w13, w2)
            out.index_add_(0, tokens, y * flat_weights[start:end, None].to(y.dtype))
            start = end
        return out


def swiglu(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    """down(silu(gate(x)) * up(x)) with gate and up fused as w13 = [gate; up]."""
    gate, up = F.linear(x, w13).chunk(2, dim=-1)
    return F.linear(F.silu(gate) * up, w2)
