"""Dense SwiGLU (and GeGLU) MLPs (dense layers, shared experts) and MoE routers."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from .linear import linear


def swiglu_mlp(x: torch.Tensor, gate: torch.Tensor, up: torch.Tensor, down: torch.Tensor,
               limit: float | None = None) -> torch.Tensor:
    """down(silu(gate x) * up x); `limit`: gate x clamped above at it and up x to [-limit, limit]
    first (DeepSeek-V4's `swiglu_limit`, its shared experts' as its routed ones')."""
    g, u = linear(x, gate), linear(x, up)
    if limit is not None:
        g, u = g.clamp(max=limit), u.clamp(min=-limit, max=limit)
    return linear(F.silu(g) * u, down)


def geglu_mlp(x: torch.Tensor, gate: torch.Tensor, up: torch.Tensor, down: torch.Tensor) -> torch.Tensor:
    """down(gelu(gate x) * up x), GELU's tanh approximation (Gemma's `gelu_pytorch_tanh` MLP)."""
    return linear(F.gelu(linear(x, gate), approximate="tanh") * linear(x, up), down)


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


def softmax_biased_topk(logits: torch.Tensor, bias: torch.Tensor, k: int,
                        min_norm: float) -> tuple[torch.Tensor, torch.Tensor]:
    """ERNIE 4.5 routing: softmax scores (float32); the top k chosen by score + `bias` (the
    correction bias steers the choice only); weighed by their unbiased scores over the sum of
    those, the sum clamped at `min_norm`."""
    scores = torch.softmax(logits.to(torch.float32), dim=-1)
    ids = torch.topk(scores + bias.to(torch.float32), k, dim=-1).indices
    weights = scores.gather(1, ids)
    return ids, weights / weights.sum(dim=-1, keepdim=True).clamp(min=min_norm)


def sigmoid_group_topk(
    logits: torch.Tensor,
    bias: torch.Tensor,
    k: int,
    num_groups: int,
    topk_groups: int,
    normalize: bool,
    scaling: float,
    dropped: float = float("-inf"),
) -> tuple[torch.Tensor, torch.Tensor]:
    """DeepSeek-V3/GLM routing: sigmoid scores; choose with the correction bias, restricted to the
    best `topk_groups` of `num_groups` groups (a group scores the sum of its top-2); weigh with the
    unbiased scores, optionally renormalized, times `scaling`.

    Experts of dropped groups are masked with -inf as transformers (>= 5) and DeepSeek's own
    inference code do: with a negative correction bias, a 0 fill could outrank a kept expert.
    `dropped`: their fill where a family's reference masks them otherwise (A.X-K2's 0.0)."""
    scores = torch.sigmoid(logits.to(torch.float32))
    return _group_limited_topk(scores, scores + bias.to(torch.float32), k, num_groups, topk_groups, normalize, scaling,
                               dropped)


def softmax_group_sum_topk(logits: torch.Tensor, k: int, num_groups: int, topk_groups: int, normalize: bool,
                           scaling: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Mistral 4 routing: DeepSeek-V3's group-limited choice (a group scores the sum of its top-2)
    over softmax scores (float32), with no correction bias; optionally renormalized, times `scaling`.
    (transformers masks the dropped groups with 0, not -inf: softmax scores are above 0, so the
    kept experts outrank them either way.)"""
    scores = torch.softmax(logits.to(torch.float32), dim=-1)
    return _group_limited_topk(scores, scores, k, num_groups, topk_groups, normalize, scaling)


def _group_limited_topk(scores: torch.Tensor, choice: torch.Tensor, k: int, num_groups: int, topk_groups: int,
                        normalize: bool, scaling: float, dropped: float = float("-inf")) -> tuple[torch.Tensor, torch.Tensor]:
    """The top k by `choice` within the best `topk_groups` groups (the others' `choice` set to
    `dropped`), weighed by `scores`."""
    t, e = choice.shape
    if num_groups > 1:
        grouped = choice.view(t, num_groups, e // num_groups)
        group_scores = grouped.topk(2, dim=-1).values.sum(dim=-1)
        keep = torch.zeros_like(group_scores).scatter_(1, group_scores.topk(topk_groups, dim=-1).indices, 1.0)
        choice = choice.masked_fill(~keep.bool().repeat_interleave(e // num_groups, dim=1), dropped)
    ids = torch.topk(choice, k, dim=-1, sorted=False).indices
    weights = scores.gather(1, ids)
    if normalize:
        weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
    return ids, weights * scaling


def logit_biased_sigmoid_topk(logits: torch.Tensor, bias: torch.Tensor, k: int,
                              normalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Kolibri routing: the top k chosen by logit + `bias` (float32; the bias is added to the logits,
    not to sigmoid scores as DeepSeek-V3's), weighed by the sigmoid of their logits, renormalized to
    sum 1 where `normalize`. Returns (ids [T, k], weights [T, k] float32)."""
    logits = logits.to(torch.float32)
    ids = torch.topk(logits + bias.to(torch.float32), k, dim=-1).indices
    weights = torch.sigmoid(logits.gather(1, ids))
    if normalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return ids, weights


def sigmoid_topk(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Llama 4 routing: the k largest logits, each weighed by its sigmoid (float32), never
    renormalized. Returns (ids [T, k], weights [T, k] float32); Llama 4 applies the weights to the
    experts' input (`input_scaled_experts`), not their output."""
    top, ids = torch.topk(logits, k, dim=-1)
    return ids, torch.sigmoid(top.to(torch.float32))


def input_scaled_experts(experts: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor],
                         x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """sum over k of expert_{ids[t, k]}(weights[t, k] * x[t]), as Llama 4 routes: each of a token's
    k experts reads the token scaled by its weight (in x's dtype, as transformers scales it).
    `experts(x, ids, weights)` is an expert executor's sum of weight * expert(x) over one layer;
    it gets one row per (token, expert), each with weight 1."""
    t, k = ids.shape
    rows = (x[:, None, :] * weights.to(x.dtype)[:, :, None]).reshape(t * k, x.shape[-1])  # [T*k, H]
    ones = torch.ones(t * k, 1, dtype=x.dtype, device=x.device)
    out = experts(rows, ids.reshape(t * k, 1), ones)
    return out if k == 1 else out.view(t, k, -1).sum(dim=1)


def output_normed_experts(experts: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor],
                          x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor, norms: torch.Tensor,
                          eps: float) -> torch.Tensor:
    """sum over k of weights[t, k] * rms_norm(expert_{ids[t, k]}(x[t])) * norms[ids[t, k]], as Ergo
    routes: each route's output RMSNormed (float32, cast back) with its expert's own weight [E, H]
    before the weighted sum (float32, cast to x's dtype). `experts` as `input_scaled_experts`':
    it gets one row per (token, expert), each with weight 1."""
    t, k = ids.shape
    rows = x.repeat_interleave(k, dim=0)  # [T*k, H]
    ones = torch.ones(t * k, 1, dtype=x.dtype, device=x.device)
    out = experts(rows, ids.reshape(t * k, 1), ones).to(torch.float32)
    normed = out * torch.rsqrt(out.pow(2).mean(-1, keepdim=True) + eps) * norms[ids.reshape(-1)].to(torch.float32)
    return (normed.to(x.dtype).view(t, k, -1) * weights[:, :, None]).sum(dim=1).to(x.dtype)


def softmax_topk_pnorm(logits: torch.Tensor, k: int, p: float | None) -> tuple[torch.Tensor, torch.Tensor]:
    """DBRX routing: softmax top-k, the k weights divided by their p-norm (`moe_normalize_expert_weights`:
    1 renormalizes them to sum 1; None leaves them as they are)."""
    ids, weights = softmax_topk(logits, k, normalize=False)
    if p is not None:
        weights = weights / torch.norm(weights, p=p, dim=-1, keepdim=True)
    return ids, weights


def sparsemixer_top2(logits: torch.Tensor, jitter_eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Phi-3.5-MoE routing (sparsemixer as it runs at inference), always two experts: the best
    one, weighed by its softmax over the experts whose logits lie within a relative `2 * jitter_eps`
    of it (the others masked); then the best of the rest, weighed the same way among the rest.
    In float32. Returns (ids [T, 2], weights [T, 2] float32)."""
    scores = logits.to(torch.float32)
    rest, ids, weights = scores, [], []
    for _ in range(2):
        top, index = rest.max(dim=-1, keepdim=True)  # [T, 1]
        # (the distance is relative to the larger of |logit| and the top, as transformers' sparsemixer has it)
        far = (top - scores) / scores.abs().clamp(min=top) > 2 * jitter_eps
        gates = torch.softmax(rest.masked_fill(far, float("-inf")), dim=-1)
        ids.append(index)
        weights.append(gates.gather(-1, index))
        rest = rest.scatter(-1, index, float("-inf"))
    return torch.cat(ids, dim=-1), torch.cat(weights, dim=-1)


# DeepSeek-V4's `scoring_func`s (transformers' ACT2FN names): a router logit -> an expert's score
SCORE_FUNCTIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "sqrtsoftplus": lambda logits: F.softplus(logits).sqrt(),
    "sigmoid": torch.sigmoid,
}


def renormalized_choice(scores: torch.Tensor, ids: torch.Tensor, scaling: float) -> torch.Tensor:
    """DeepSeek-V4's weights of the chosen experts `ids` [T, k]: their scores over the sum of those
    (always renormalized), times `scaling` (routed_scaling_factor)."""
    weights = scores.gather(1, ids)
    return weights / (weights.sum(dim=-1, keepdim=True) + 1e-20) * scaling


def biased_topk(scores: torch.Tensor, bias: torch.Tensor, k: int, scaling: float) -> tuple[torch.Tensor, torch.Tensor]:
    """DeepSeek-V4 routing: the top k chosen by score + `bias` (the correction bias steers the
    choice only), weighed by `renormalized_choice`. No groups. Returns (ids [T, k], weights [T, k])."""
    ids = torch.topk(scores + bias, k, dim=-1, sorted=False).indices
    return ids, renormalized_choice(scores, ids, scaling)
