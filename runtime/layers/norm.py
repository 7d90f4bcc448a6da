"""RMSNorm as Hugging Face computes it: in float32, cast back before the weight multiply."""

from __future__ import annotations

import torch


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, *, offset: float = 0.0) -> torch.Tensor:
    """weight * normalize(x); `offset=1.0` for zero-centred weights (Qwen3-Next/3.5: (1 + w))."""
    dtype = x.dtype
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    if offset:
        return (h * (offset + weight.to(torch.float32))).to(dtype)
    return weight * h.to(dtype)
