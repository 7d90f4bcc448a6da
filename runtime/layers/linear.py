"""x @ W^T, as F.linear, with decode-sized products of large CPU weights on the compiled kernel.

torch's CPU GEMV streams a large bf16 weight from DRAM at about half the memory's rate (24-30
GB/s on the 2-core VM, where the expert kernel's reader reaches 46-62): in CPU decode the
attention projections and the LM head are ~40% of the bytes a Qwen3-30B token reads. The expert
kernel's row-pair dot products (runtime/experts/csrc) serve them instead when there are a few
tokens, the weight is f32/f16/bf16 on the CPU and large enough to matter. A GGUF file's K-quant
projections stay blocks (block_weight.py), multiplied in place there too. Everything else, prefill
and the GPU included, is F.linear.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..experts.cpu_kernels import (
    BLOCK_ROW_DTYPES,
    DENSE_MAX_TOKENS,
    ROW_DTYPE_CODES,
    TORCH_NAMES,
    native_kernel,
)
from .block_weight import BlockWeight, block_linear

# Weights smaller than this (bytes) stay on torch, where the kernel's call overhead would dominate.
# Measured on the 2-core VM (bench_decode's model, bf16, decode tok/s in interleaved rounds): torch
# only 107, kernel from 1 MiB 154, from 256 KiB 163, from 64 KiB 167 (docs/benchmark-history.md).
DENSE_KERNEL_MIN_BYTES = 64 << 10


def linear(x: torch.Tensor, weight: torch.Tensor | BlockWeight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear(x, weight, bias) for x [T, C]; the result in x's dtype."""
    if isinstance(weight, BlockWeight):
        return block_linear(x, weight, bias, _cpu_block_gemv, _cpu_block_values)
    if (x.device.type != "cpu" or x.dim() != 2 or not 1 <= x.shape[0] <= DENSE_MAX_TOKENS
            or x.shape[1] != weight.shape[-1] or weight.dtype not in TORCH_NAMES
            or weight.numel() * weight.element_size() < DENSE_KERNEL_MIN_BYTES or not weight.is_contiguous()):
        return F.linear(x, weight, bias)
    kernel = native_kernel()
    if kernel is None:
        return F.linear(x, weight, bias)
    out = kernel.dense(x, weight, torch.get_num_threads())
    if bias is not None:
        out += bias
    return out.to(x.dtype)


def _cpu_block_gemv(x: torch.Tensor, weight: BlockWeight) -> torch.Tensor | None:
    """x [T, C] times K-quant rows in place, float32, the activations rounded to Q8_K as the
    expert kernel's are; None without the kernel, past DENSE_MAX_TOKENS tokens (a prompt) or in
    a float32 model, which gets the reference's products (dequantized in chunks instead)."""
    kernel = native_kernel()
    if kernel is None or x.shape[0] > DENSE_MAX_TOKENS or x.dtype == torch.float32:
        return None
    return kernel.dense_blocks(x, weight.data, weight.dtype_name, torch.get_num_threads())


def _cpu_block_values(weight: BlockWeight, start: int, stop: int, dtype: torch.dtype) -> torch.Tensor | None:
    """Rows [start, stop) of a K-quant, MXFP4 or Q8_0 weight in `dtype`, dequantized by the kernel on the
    prompt's threads (bit for bit weight.values'); None without the kernel or for another dtype."""
    kernel = native_kernel()
    if kernel is None or weight.dtype_name not in BLOCK_ROW_DTYPES:
        return None
    if dtype in ROW_DTYPE_CODES:
        return kernel.dequant_rows(weight.data[start:stop], weight.dtype_name, dtype, torch.get_num_threads())
    return kernel.dequant_rows(weight.data[start:stop], weight.dtype_name, threads=torch.get_num_threads()).to(dtype)
