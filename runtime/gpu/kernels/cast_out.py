"""Triton kernel that casts a decode layer's float32 expert output to the model's dtype, as one
more link of a step graph's PDL chain (dependent_launch.py).

The slot kernels sum a token's pairs into float32 with atomics, so the output is cast after the
down pass. torch's cast is a plain launch: in a step graph it neither starts during the down
pass's tail nor lets the next layer's route plan start during its own, so each layer paid two
launch latencies around a sub-microsecond copy. This kernel takes part in the chain. Its twin is
`src.to(dtype)` (the same rounding: round to nearest even).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from . import dependent_launch

BLOCK = 1024  # elements a program casts: a decode row of 2-8k elements is a few programs


@triton.jit
def _cast_kernel(src_ptr, dst_ptr, n, BLOCK: tl.constexpr, PDL: tl.constexpr):
    if PDL:  # wait for the kernel before, then let the next one launch (dependent_launch.py)
        gdc_wait()
        gdc_launch_dependents()
    at = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    keep = at < n
    tl.store(dst_ptr + at, tl.load(src_ptr + at, mask=keep).to(dst_ptr.dtype.element_ty), mask=keep)


def cast_out(src: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """`src` in `dtype` (a new tensor; `src` itself where it has that dtype), launched with PDL
    inside a step graph's scope (dependent_launch.enabled)."""
    if src.dtype == dtype:
        return src
    src = src.contiguous()
    dst = torch.empty(src.shape, dtype=dtype, device=src.device)
    n, pdl = src.numel(), dependent_launch.enabled(src.device)
    _cast_kernel[(triton.cdiv(n, BLOCK),)](src, dst, n, BLOCK=BLOCK, PDL=pdl, launch_pdl=pdl)
    return dst
