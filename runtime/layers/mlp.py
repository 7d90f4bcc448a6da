"""Dense SwiGLU MLP (dense layers, shared experts) and MoE routers."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from .linear import linear


def swiglu_mlp(x: torch.Tensor, gate: torch.Tensor, up: torch.Tensor, down: torch.Tensor) -> torch.Tensor:
    return linear(F.silu(linear(x, gate)) * linear(x, up), down)


# (supports, kernel): set by the GPU runtime when a model runs on the GPU (DeviceModel)
_device_router: tuple[Callable[..., bool], Callable[..., tuple[torch.Tensor, torch.Tensor]]] | None = None


def use_device_router(supports: Callable[..., bool],
                      kernel: Callable[..., tuple[torch.Tensor, torch.Tensor]]) -> None:
    """From now on, `softmax_topk(logits, k, normalize)` is `kernel(logits, k, normalize)`
    wherever `supports(logits, k)` (a fused kernel: runtime/gpu/kernels/router_topk.py)."""
    global _device_router
    _device_router = (supports, kernel)


def softmax_topk(logits: torch.Tensor, k: int, normalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Qwen/Mixtral routing: softmax over all experts (float32), top-k, optionally renormalized.
    Returns (ids [T, k], weights [T, k] float32)."""
    if _device_router is not None and _device_router[0](logits, k):
        return _device_router[1](logits, k, normalize)
    probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
    weights, ids = torch.topk(probs, k, dim=-1)
    if normalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return ids, weights


def softmax_group_topk(logits: torch.Tensor, k: int, num_groups: int, topk_groups: int,
                       scaling: float) -> tuple[torch.Tensor, torch.Tensor]:
    """DeepSeek-V2 routing ("greedy", or "group_limited_greedy" where num_groups > 1): softmax
    scores in float32; with groups, only the best `topk_groups` groups (a group scores its best
    expert) keep theirs, the others 0, as transformers masks them; the top k, times `scaling`,
    never renormalized."""
    scores = torch.softmax(logits.to(torch.float32), dim=-1)
    t, e = scores.shape
    if num_groups > 1:
        group_scores = scores.view(t, num_groups, e // num_groups).max(dim=-1).values
        keep = torch.zeros_like(group_scores).scatter_(1, group_scores.topk(topk_groups, dim=-1).indices, 1.0)
        scores = scores.masked_fill(~keep.bool().repeat_interleave(e // num_groups, dim=1), 0.0)
    weights, ids = torch.topk(scores, k, dim=-1, sorted=False)
    return ids, weights * scaling


def sigmoid_group_topk(
    logits: torch.Tensor,
    bias: torch.Tensor,
    k: int,
    num_groups: int,
    topk_groups: int,
    normalize: bool,
    scaling: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """DeepSeek-V3/GLM routing: sigmoid scores; choose with the correction bias, restricted to the
    best `topk_groups` of `num_groups` groups (a group scores the sum of its top-2); weigh with the
    unbiased scores, optionally renormalized, times `scaling`.

    Experts of dropped groups are masked with -inf as transformers (>= 5) and DeepSeek's own
    inference code do: with a negative correction bias, a 0 fill could outrank a kept expert."""
    scores = torch.sigmoid(logits.to(torch.float32))
    choice = scores + bias.to(torch.float32)
    t, e = choice.shape
    if num_groups > 1:
        grouped = choice.view(t, num_groups, e // num_groups)
        group_scores = grouped.topk(2, dim=-1).values.sum(dim=-1)
        keep = torch.zeros_like(group_scores).scatter_(1, group_scores.topk(topk_groups, dim=-1).indices, 1.0)
        choice = choice.masked_fill(~keep.bool().repeat_interleave(e // num_groups, dim=1), float("-inf"))
    ids = torch.topk(choice, k, dim=-1, sorted=False).indices
    weights = scores.gather(1, ids)
    if normalize:
        weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
    return ids, weights * scaling
