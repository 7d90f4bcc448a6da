"""RMSNorm as Hugging Face computes it: in float32, cast back before the weight multiply.

On a GPU the GPU runtime hands in a fused kernel of the same computation (one launch for
torch's eight: runtime/gpu/kernels/rms_norm.py) through `use_device_kernel`; this module
imports nothing of the GPU runtime, and calls the kernel declines run here as written.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

# (supports, kernel): set by the GPU runtime when a model runs on the GPU (DeviceModel)
_device_kernel: tuple[Callable[..., bool], Callable[..., torch.Tensor]] | None = None


def use_device_kernel(supports: Callable[..., bool], kernel: Callable[..., torch.Tensor]) -> None:
    """From now on, `rms_norm(x, weight, eps, offset=...)` is `kernel(x, weight, eps, offset)`
    wherever `supports(x, weight, offset)`."""
    global _device_kernel
    _device_kernel = (supports, kernel)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, *, offset: float = 0.0) -> torch.Tensor:
    """weight * normalize(x); `offset=1.0` for zero-centred weights (Qwen3-Next/3.5: (1 + w))."""
    if _device_kernel is not None and _device_kernel[0](x, weight, offset):
        return _device_kernel[1](x, weight, eps, offset)
    dtype = x.dtype
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    if offset:
        return (h * (offset + weight.to(torch.float32))).to(dtype)
    return weight * h.to(dtype)
