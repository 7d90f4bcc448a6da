"""GGML block quants dequantized with torch ops, on whatever device the bytes are: a GGUF
model's expert records read where they lie (a cache slot, a streamed bank, a host bank row).

The arithmetic is gguf-py's (`gguf.quants`, the reference the tests hold these to, bit for bit):
each block's scales in float32, then `d * q - dm` (or `d * q`) elementwise, in the same order,
so the values are the same on the CPU and the GPU. A call is a fixed sequence of elementwise
ops on fixed shapes, with no host sync: a CUDA graph can capture it.

Formats: Q8_0 (blocks of 32: an fp16 scale, 32 int8), and the K-quants of the Q4_K_M-like files
most users download: Q4_K, Q5_K (256 values: fp16 scale and min, 6-bit sub-block scales and
mins) and Q6_K (256 values: 16 int8 sub-block scales, an fp16 scale). Others (Q4_0, Q2_K, IQ...)
have no device path yet: `DEVICE_BLOCK_DTYPES` names those that do.
"""

from __future__ import annotations

import math

import torch

from ftw.format import BLOCK_DTYPES

QK_K = 256


def _f16(column: torch.Tensor) -> torch.Tensor:
    """Two bytes per block [N, 2] as their float16 value, in float32 [N, 1]."""
    return column.contiguous().view(torch.float16).to(torch.float32)


def _shifts(values: list[int], device: torch.device, shape: tuple[int, ...]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.uint8, device=device).reshape(shape)


def _q8_0(blocks: torch.Tensor) -> torch.Tensor:
    d = _f16(blocks[:, :2])
    x = blocks[:, 2:].contiguous().view(torch.int8).to(torch.float32)
    return x * d


def _scale_min_k4(scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The 8 sub-blocks' 6-bit scales and mins packed in 12 bytes [N, 12] -> ([N, 8], [N, 8])."""
    n = scales.shape[0]
    packed = scales.reshape(n, 3, 4)
    d, m, m_d = packed[:, 0], packed[:, 1], packed[:, 2]
    sc = torch.cat([d & 0x3F, (m_d & 0x0F) | ((d >> 2) & 0x30)], dim=-1)
    mn = torch.cat([m & 0x3F, (m_d >> 4) | ((m >> 2) & 0x30)], dim=-1)
    return sc, mn


def _q4_k(blocks: torch.Tensor) -> torch.Tensor:
    n = blocks.shape[0]
    d, dmin = _f16(blocks[:, 0:2]), _f16(blocks[:, 2:4])
    sc, mn = _scale_min_k4(blocks[:, 4:16])
    d = (d * sc.to(torch.float32)).reshape(n, -1, 1)
    dm = (dmin * mn.to(torch.float32)).reshape(n, -1, 1)
    qs = blocks[:, 16:144].reshape(n, -1, 1, 32) >> _shifts([0, 4], blocks.device, (1, 1, 2, 1))
    qs = (qs & 0x0F).reshape(n, -1, 32).to(torch.float32)
    return (d * qs - dm).reshape(n, QK_K)


def _q5_k(blocks: torch.Tensor) -> torch.Tensor:
    n = blocks.shape[0]
    d, dmin = _f16(blocks[:, 0:2]), _f16(blocks[:, 2:4])
    sc, mn = _scale_min_k4(blocks[:, 4:16])
    d = (d * sc.to(torch.float32)).reshape(n, -1, 1)
    dm = (dmin * mn.to(torch.float32)).reshape(n, -1, 1)
    qh, qs = blocks[:, 16:48], blocks[:, 48:176]
    ql = qs.reshape(n, -1, 1, 32) >> _shifts([0, 4], blocks.device, (1, 1, 2, 1))
    qh = qh.reshape(n, -1, 1, 32) >> _shifts(list(range(8)), blocks.device, (1, 1, 8, 1))
    ql = (ql & 0x0F).reshape(n, -1, 32)
    qh = (qh & 0x01).reshape(n, -1, 32)
    q = (ql | (qh << 4)).to(torch.float32)
    return (d * q - dm).reshape(n, QK_K)


def _q6_k(blocks: torch.Tensor) -> torch.Tensor:
    n = blocks.shape[0]
    ql, qh = blocks[:, 0:128], blocks[:, 128:192]
    scales = blocks[:, 192:208].contiguous().view(torch.int8).to(torch.float32)
    d = (_f16(blocks[:, 208:210]) * scales).reshape(n, QK_K // 16, 1)
    ql = ql.reshape(n, -1, 1, 64) >> _shifts([0, 4], blocks.device, (1, 1, 2, 1))
    ql = (ql & 0x0F).reshape(n, -1, 32)
    qh = qh.reshape(n, -1, 1, 32) >> _shifts([0, 2, 4, 6], blocks.device, (1, 1, 4, 1))
    qh = (qh & 0x03).reshape(n, -1, 32)
    q = (ql | (qh << 4)).to(torch.int8) - 32
    q = q.reshape(n, QK_K // 16, -1).to(torch.float32)
    return (d * q).reshape(n, QK_K)


_BLOCKS = {"q8_0": _q8_0, "q4_k": _q4_k, "q5_k": _q5_k, "q6_k": _q6_k}
DEVICE_BLOCK_DTYPES = frozenset(_BLOCKS)


def dequantize_blocks(raw: torch.Tensor, dtype_name: str, shape: tuple[int, ...]) -> torch.Tensor:
    """`raw` uint8 [n, bytes]: n weights of logical `shape` stored as `dtype_name` blocks (GGML
    rows: blocks along the last dimension) -> float32 [n, *shape]."""
    if dtype_name not in _BLOCKS:
        raise ValueError(f"{dtype_name} has no device dequantizer (these do: {', '.join(sorted(_BLOCKS))})")
    block_size, type_size = BLOCK_DTYPES[dtype_name]
    per_weight = math.prod(shape) // block_size * type_size
    if raw.dtype != torch.uint8 or raw.dim() != 2 or raw.shape[1] != per_weight or shape[-1] % block_size:
        raise ValueError(f"{dtype_name} {list(shape)}: expected uint8 [n, {per_weight}], got {raw.dtype} "
                         f"{tuple(raw.shape)}")
    values = _BLOCKS[dtype_name](raw.reshape(-1, type_size))  # [n * blocks, block_size]
    return values.reshape(raw.shape[0], *shape)
