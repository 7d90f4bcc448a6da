"""RMSNorm as Hugging Face computes it: in float32, cast back before the weight multiply; and
LayerNorm (torch's, as nn.LayerNorm runs it) for the families that use one.

On a GPU the GPU runtime hands in a fused kernel of the same computation (one launch for
torch's eight: runtime/gpu/kernels/rms_norm.py) through `use_device_kernel`; this module
imports nothing of the GPU runtime, and calls the kernel declines run here as written. On the
CPU, f32 and bf16 rows are normed by the compiled kernel (runtime/experts/csrc/rows.cpp: one call
where torch's eight small ops cost ~20 us a decode row in dispatch), the same float32 steps but
for the order the squares are summed in.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..experts.cpu_kernels import ROW_DTYPE_CODES, native_kernel

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
    if _cpu_kernel_takes(x, weight):
        kernel = native_kernel()
        if kernel is not None:
            return kernel.rms_norm(x, weight, eps, offset, torch.get_num_threads())
    return torch_rms_norm(x, weight, eps, offset=offset)


def torch_rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float, *, offset: float = 0.0) -> torch.Tensor:
    """`rms_norm` in torch's ops, as transformers writes it (`weight` None: none, `l2_norm`): the
    form the kernels are held to."""
    dtype = x.dtype
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    if weight is None:
        return h.to(dtype)
    if offset:
        return (h * (offset + weight.to(torch.float32))).to(dtype)
    return weight * h.to(dtype)


def _cpu_kernel_takes(x: torch.Tensor, weight: torch.Tensor | None) -> bool:
    """Whether the CPU kernel norms `x`, times `weight` where given: contiguous, one dtype it takes.
    (Checked in attributes that cost ~0.1 us: a decode row's norm is ~3 us in the kernel.)"""
    return (x.is_cpu and x.dtype in ROW_DTYPE_CODES and x.is_contiguous()
            and (weight is None or (weight.is_cpu and weight.dtype == x.dtype and weight.dim() == 1
                                    and weight.shape[0] == x.shape[-1] and weight.is_contiguous())))


def l2_norm(x: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm without a weight, in float32 and cast back (Llama 4's q/k norm, `Llama4TextL2Norm`)."""
    if _cpu_kernel_takes(x, None):
        kernel = native_kernel()
        if kernel is not None:
            return kernel.rms_norm(x, None, eps, 0.0, torch.get_num_threads())
    return torch_rms_norm(x, None, eps)


@dataclass(frozen=True)
class LayerNorm:
    """nn.LayerNorm's weights, called on x [..., H]: mean and variance removed, then `weight`,
    then `bias` where there is one (Phi-3.5-MoE has them, DBRX does not). A block's norm is
    this or an RMSNorm weight tensor (models/base.py)."""

    weight: torch.Tensor
    bias: torch.Tensor | None
    eps: float

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, (x.shape[-1],), self.weight, self.bias, self.eps)


@dataclass(frozen=True)
class Float32RMSNorm:
    """RMSNorm whose float32 `weight` multiplies before the cast back (DeepSeek-V4 keeps its norm
    weights in float32: transformers' DeepseekV4RMSNorm), called on x [..., H]."""

    weight: torch.Tensor
    eps: float

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return (self.weight.to(torch.float32) * h).to(x.dtype)


@dataclass(frozen=True)
class GatedRMSNorm:
    """RMSNorm, then times a low-rank gate of its own output: y = rms_norm(x) * sigmoid(fc2 silu(fc1 y)),
    the gate in float32 and the product cast back (A.X-K2's AXK2GatedRMSNorm, Megatron's
    GatedNormWrapper), called on x [..., H]; fc1 [rank, H], fc2 [H, rank]."""

    weight: torch.Tensor
    fc1: torch.Tensor
    fc2: torch.Tensor
    eps: float

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        y = rms_norm(x, self.weight, self.eps)
        gate = torch.sigmoid(F.linear(F.silu(F.linear(y, self.fc1)), self.fc2).float())
        return (y * gate).to(y.dtype)


def unweighted_rms_norm(x: torch.Tensor, eps: float) -> torch.Tensor:
    """x / rms(x), the rms taken in float32 and cast to x's dtype before the product (DeepSeek-V4's
    DeepseekV4UnweightedRMSNorm: its per-head query norm and the hyper-connections' input norm)."""
    return x * torch.rsqrt(x.float().square().mean(-1, keepdim=True) + eps).to(x.dtype)
