"""Triton kernel for softmax top-k routing on the GPU (Qwen, Mixtral): one launch where torch's
form (runtime/layers/mlp.softmax_topk, the semantics this follows) makes five (the softmax, the
top-k's two kernels, the sum and the division of the renormalization).

A program routes one token: the softmax over its experts in float32, then the k best by k
passes of an argmax (ties to the lower expert id), best first, then the renormalization. The
exponentials and sums are not torch's to the last bit: weights agree to float32 rounding, and
two experts whose probabilities tie within it may be ordered or chosen differently.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _router_topk_kernel(logits_ptr, ids_ptr, weights_ptr, num_experts, stride_row, K: tl.constexpr,
                        BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr, NORMALIZE: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    experts = tl.arange(0, BLOCK_E)
    valid = experts < num_experts
    x = tl.load(logits_ptr + row * stride_row + experts, mask=valid, other=float("-inf")).to(tl.float32)
    e = tl.exp(x - tl.max(x, axis=0))
    e = tl.where(valid, e, 0.0)
    probs = e / tl.sum(e, axis=0)
    left = tl.where(valid, probs, -1.0)
    slots = tl.arange(0, BLOCK_K)
    ids = tl.zeros([BLOCK_K], dtype=tl.int64)
    weights = tl.zeros([BLOCK_K], dtype=tl.float32)
    for j in tl.static_range(K):
        best = tl.max(left, axis=0)
        at = tl.min(tl.where(left == best, experts, BLOCK_E), axis=0)  # the lowest id among equals
        ids = tl.where(slots == j, at.to(tl.int64), ids)
        weights = tl.where(slots == j, best, weights)
        left = tl.where(experts == at, -2.0, left)
    if NORMALIZE:
        weights = weights / tl.sum(tl.where(slots < K, weights, 0.0), axis=0)
    tl.store(ids_ptr + row * K + slots, ids, mask=slots < K)
    tl.store(weights_ptr + row * K + slots, weights, mask=slots < K)


def supports(logits: torch.Tensor, k: int) -> bool:
    """Whether `softmax_topk_fused` takes this call: CUDA logits [T, E] of a float dtype with unit
    expert stride, 0 < k <= E <= 1024."""
    return (logits.is_cuda and logits.dim() == 2 and logits.dtype in (torch.bfloat16, torch.float16, torch.float32)
            and 0 < k <= logits.shape[1] <= 1024 and logits.stride(1) == 1 and logits.shape[0] > 0)


def softmax_topk_fused(logits: torch.Tensor, k: int, normalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """runtime.layers.mlp.softmax_topk in one launch: (ids [T, k] int64, weights [T, k] float32)."""
    tokens, num_experts = logits.shape
    ids = torch.empty(tokens, k, dtype=torch.int64, device=logits.device)
    weights = torch.empty(tokens, k, dtype=torch.float32, device=logits.device)
    _router_topk_kernel[(tokens,)](logits, ids, weights, num_experts, logits.stride(0), K=k,
                                   BLOCK_E=triton.next_power_of_2(num_experts), BLOCK_K=triton.next_power_of_2(k),
                                   NORMALIZE=normalize, num_warps=1 if num_experts <= 256 else 4)
    return ids, weights
