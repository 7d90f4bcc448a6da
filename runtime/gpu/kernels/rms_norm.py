"""Triton kernel for RMSNorm on the GPU: one launch where torch's form (runtime/layers/norm.py,
the semantics this follows) makes eight: the cast to float32, the square, the mean, the add of
eps, the reciprocal root, the scale, the cast back, the weight's multiply.

A decode step of a whole Qwen3-MoE model runs four norms a layer (before attention and the MoE
block, and on each head's query and key), and its graph spent ~35 us a layer of its ~207 in
their small kernels on the H200 (`bench_model_decode.py --profile-steps`). A program normalizes
one row; the float32 steps are torch's, so the result differs from torch's only where the sum of
squares, summed in another order, moves a value across a rounding boundary of the output dtype.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

DTYPES = (torch.bfloat16, torch.float16, torch.float32)


@triton.jit
def _rms_norm_kernel(x_ptr, w_ptr, out_ptr, n_cols, stride_x, stride_out, eps, offset,
                     BLOCK: tl.constexpr, OFFSET: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    keep = cols < n_cols
    h = tl.load(x_ptr + row * stride_x + cols, mask=keep, other=0.0).to(tl.float32)
    scaled = h * tl.math.rsqrt(tl.sum(h * h, axis=0) / n_cols + eps)
    w = tl.load(w_ptr + cols, mask=keep, other=0.0).to(tl.float32)
    out_type = out_ptr.dtype.element_ty
    if OFFSET:  # (h * (offset + w)) in float32, then the output dtype
        y = scaled * (offset + w)
    else:  # weight * h.to(dtype): h rounded to the output dtype first, then the product rounded
        y = scaled.to(out_type).to(tl.float32) * w
    tl.store(out_ptr + row * stride_out + cols, y.to(out_type), mask=keep)


def supports(x: torch.Tensor, weight: torch.Tensor, offset: float) -> bool:
    """Whether `rms_norm_fused` computes this call (else torch's form does): a CUDA tensor of a
    float dtype whose last dim the weight spans, in the weight's dtype unless `offset` is set
    (torch's `weight * h` would then promote to the wider of the two)."""
    return (x.is_cuda and x.dtype in DTYPES and weight.dim() == 1 and x.shape[-1] == weight.numel()
            and (bool(offset) or weight.dtype == x.dtype) and x.numel() > 0)


def rms_norm_fused(x: torch.Tensor, weight: torch.Tensor, eps: float, offset: float = 0.0) -> torch.Tensor:
    """runtime.layers.norm.rms_norm in one launch (see `supports` for the calls it takes)."""
    cols = x.shape[-1]
    rows = x.reshape(-1, cols)
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    out = torch.empty(rows.shape, dtype=x.dtype, device=x.device)
    block = triton.next_power_of_2(cols)
    _rms_norm_kernel[(rows.shape[0],)](rows, weight.contiguous(), out, cols, rows.stride(0), out.stride(0), eps,
                                       float(offset), BLOCK=block, OFFSET=bool(offset),
                                       num_warps=max(1, min(8, block // 256)))
    return out.reshape(x.shape)
