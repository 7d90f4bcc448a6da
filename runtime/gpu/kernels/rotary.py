"""Triton kernel for rotate-half rotary embeddings on the GPU: one launch where torch's form
(runtime/layers/rope.apply_rotary, the semantics this follows) makes five to seven (the halves'
negation and concatenation, two products, their sum, and the concatenation with the channels
that do not rotate).

Elementwise, so it matches torch bit for bit: each product is rounded to the tensor's dtype, as
torch rounds every op's result, then their sum. The launch turns off the compiler's fusion of a
product and a sum into one FMA (`enable_fp_fusion=False`), which rounds once where torch rounds
twice: with it, the H200 gave up to 570 of 4096 bf16 elements a unit apart, and float32 ones too.
A program rotates one (token, head) row.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

DTYPES = (torch.bfloat16, torch.float16, torch.float32)


@triton.jit
def _rotary_kernel(x_ptr, cos_ptr, sin_ptr, out_ptr, heads, stride_t, stride_h, stride_cos, stride_out_t,
                   stride_out_h, DIM: tl.constexpr, ROT: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    t, h = row // heads, row % heads
    cols = tl.arange(0, BLOCK)
    in_dim = cols < DIM
    x_row = x_ptr + t.to(tl.int64) * stride_t + h.to(tl.int64) * stride_h
    x = tl.load(x_row + cols, mask=in_dim, other=0.0)
    rot = cols < ROT
    half: tl.constexpr = ROT // 2
    partner = tl.where(cols < half, cols + half, cols - half)  # rotate_half: (-x2, x1)
    other = tl.load(x_row + partner, mask=rot, other=0.0).to(tl.float32)
    other = tl.where(cols < half, -other, other)  # (negated in float32: exact, and the interpreter's bf16 is raw bits)
    cos = tl.load(cos_ptr + t.to(tl.int64) * stride_cos + cols, mask=rot, other=0.0).to(tl.float32)
    sin = tl.load(sin_ptr + t.to(tl.int64) * stride_cos + cols, mask=rot, other=0.0).to(tl.float32)
    dtype = x.dtype
    xf = x.to(tl.float32)
    a = (xf * cos).to(dtype).to(tl.float32)  # x * cos, rounded as torch rounds it
    b = (other * sin).to(dtype).to(tl.float32)  # rotate_half(x) * sin
    y = tl.where(rot, a + b, xf)  # the sum rounded below; the channels that do not rotate pass exactly
    tl.store(out_ptr + t.to(tl.int64) * stride_out_t + h.to(tl.int64) * stride_out_h + cols, y.to(dtype), mask=in_dim)


def supports(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> bool:
    """Whether `apply_rotary_fused` computes this call as torch's form does: CUDA tensors of one
    float dtype, x [T, heads, D] with unit channel stride, cos/sin [T, R] alike with R <= D even."""
    return (x.is_cuda and x.dim() == 3 and x.dtype in DTYPES and cos.dtype == sin.dtype == x.dtype
            and cos.shape == sin.shape and cos.dim() == 2 and cos.shape[0] == x.shape[0]
            and cos.shape[1] <= x.shape[2] and cos.shape[1] % 2 == 0 and x.stride(2) == 1
            and cos.stride() == sin.stride() and cos.stride(1) == 1 and x.numel() > 0)


def apply_rotary_fused(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """runtime.layers.rope.apply_rotary in one launch (see `supports` for the calls it takes)."""
    tokens, heads, dim = x.shape
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    _rotary_kernel[(tokens * heads,)](x, cos, sin, out, heads, x.stride(0), x.stride(1), cos.stride(0),
                                      out.stride(0), out.stride(1), DIM=dim, ROT=cos.shape[1],
                                      BLOCK=triton.next_power_of_2(dim), num_warps=1 if dim <= 256 else 4,
                                      enable_fp_fusion=False)
    return out
