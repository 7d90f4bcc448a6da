"""GGML block quants dequantized with torch ops, on whatever device the bytes are: a GGUF
model's expert records read where they lie (a cache slot, a streamed bank, a host bank row).

The arithmetic is gguf-py's (`gguf.quants`, the reference the tests hold these to, bit for bit):
each block's scales in float32, then `d * q - dm` (or `d * q`) elementwise, in the same order,
so the values are the same on the CPU and the GPU. A call is a fixed sequence of elementwise
ops on fixed shapes, with no host sync: a CUDA graph can capture it.

Formats: the 32-value blocks (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0: an fp16 scale, maybe an fp16 min,
4, 5 or 8 bits a value) and the K-quants of the Q2_K...Q6_K files (256 values in sub-blocks of
16 or 32 with their own scales): every GGML type FTW stores but the IQ and ternary ones
(`DEVICE_BLOCK_DTYPES` names those that have a device path), and gpt-oss's MXFP4.
"""

from __future__ import annotations

import math

import torch

from ftw.format import BLOCK_DTYPES

QK_K = 256


def _f16(column: torch.Tensor) -> torch.Tensor:
    """Two bytes per block [N, 2] as their float16 value, in float32 [N, 1]."""
    return column.contiguous().view(torch.float16).to(torch.float32)


_SHIFTS: dict[tuple, torch.Tensor] = {}


def _shifts(values: list[int], device: torch.device, shape: tuple[int, ...]) -> torch.Tensor:
    """The bit shifts as a uint8 tensor on `device`, made once a device: made on each call, a
    CUDA device's copy from the host list waited for the stream (the GPU host's prompt profile
    counted 208 such waits in a 512-token Q4_K_M prompt at -ncmoe 16's budget)."""
    key = (tuple(values), str(device), shape)
    shifts = _SHIFTS.get(key)
    if shifts is None:
        shifts = _SHIFTS[key] = torch.tensor(values, dtype=torch.uint8, device=device).reshape(shape)
    return shifts


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


def _sub_block_scales(blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q4_K's and Q5_K's head: each sub-block's scale d x sc and min dmin x m, [N, 8, 1] each."""
    n = blocks.shape[0]
    d, dmin = _f16(blocks[:, 0:2]), _f16(blocks[:, 2:4])
    sc, mn = _scale_min_k4(blocks[:, 4:16])
    return (d * sc.to(torch.float32)).reshape(n, -1, 1), (dmin * mn.to(torch.float32)).reshape(n, -1, 1)


def _q4_k(blocks: torch.Tensor) -> torch.Tensor:
    n = blocks.shape[0]
    d, dm = _sub_block_scales(blocks)
    qs = blocks[:, 16:144].reshape(n, -1, 1, 32) >> _shifts([0, 4], blocks.device, (1, 1, 2, 1))
    qs = (qs & 0x0F).reshape(n, -1, 32).to(torch.float32)
    return (d * qs - dm).reshape(n, QK_K)


def _q5_k(blocks: torch.Tensor) -> torch.Tensor:
    n = blocks.shape[0]
    d, dm = _sub_block_scales(blocks)
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


def _nibbles(qs: torch.Tensor) -> torch.Tensor:
    """A 32-value block's 16 bytes [N, 16] -> its 4-bit values [N, 32]: the low nibbles, then the high."""
    n = qs.shape[0]
    return ((qs.reshape(n, -1, 1, 16) >> _shifts([0, 4], qs.device, (1, 1, 2, 1))) & 0x0F).reshape(n, -1)


def _fifth_bits(qh: torch.Tensor) -> torch.Tensor:
    """Four bytes [N, 4] read as a little-endian uint32 -> its 32 bits [N, 32], bit i at i."""
    word = qh.to(torch.int64)
    word = word[:, 0] | (word[:, 1] << 8) | (word[:, 2] << 16) | (word[:, 3] << 24)
    return ((word[:, None] >> torch.arange(32, device=qh.device)) & 1).to(torch.uint8)


def _q4_0(blocks: torch.Tensor) -> torch.Tensor:
    d = _f16(blocks[:, :2])
    return d * (_nibbles(blocks[:, 2:]).to(torch.int8) - 8).to(torch.float32)


def _q4_1(blocks: torch.Tensor) -> torch.Tensor:
    d, m = _f16(blocks[:, :2]), _f16(blocks[:, 2:4])
    return (d * _nibbles(blocks[:, 4:]).to(torch.float32)) + m


def _q5_0(blocks: torch.Tensor) -> torch.Tensor:
    d = _f16(blocks[:, :2])
    q = (_nibbles(blocks[:, 6:]) | (_fifth_bits(blocks[:, 2:6]) << 4)).to(torch.int8) - 16
    return d * q.to(torch.float32)


def _q5_1(blocks: torch.Tensor) -> torch.Tensor:
    d, m = _f16(blocks[:, :2]), _f16(blocks[:, 2:4])
    q = (_nibbles(blocks[:, 8:]) | (_fifth_bits(blocks[:, 4:8]) << 4)).to(torch.float32)
    return (d * q) + m


def _q2_k(blocks: torch.Tensor) -> torch.Tensor:
    n = blocks.shape[0]
    scales, qs = blocks[:, 0:16], blocks[:, 16:80]
    d, dmin = _f16(blocks[:, 80:82]), _f16(blocks[:, 82:84])
    dl = (d * (scales & 0xF).to(torch.float32)).reshape(n, QK_K // 16, 1)
    ml = (dmin * (scales >> 4).to(torch.float32)).reshape(n, QK_K // 16, 1)
    q = (qs.reshape(n, -1, 1, 32) >> _shifts([0, 2, 4, 6], blocks.device, (1, 1, 4, 1))) & 3
    q = q.reshape(n, QK_K // 16, 16).to(torch.float32)
    return (dl * q - ml).reshape(n, QK_K)


def _q3_k(blocks: torch.Tensor) -> torch.Tensor:
    n = blocks.shape[0]
    hmask, qs, packed = blocks[:, 0:32], blocks[:, 32:96], blocks[:, 96:108]
    d = _f16(blocks[:, 108:110])
    low = (packed[:, :8].reshape(n, 1, 8) >> _shifts([0, 4], blocks.device, (1, 2, 1))).reshape(n, 16)
    high = (packed[:, 8:].reshape(n, 1, 4) >> _shifts([0, 2, 4, 6], blocks.device, (1, 4, 1))).reshape(n, 16)
    scales = ((low & 0x0F) | ((high & 0x03) << 4)).to(torch.int8) - 32
    dl = (d * scales.to(torch.float32)).reshape(n, 16, 1)
    ql = (qs.reshape(n, -1, 1, 32) >> _shifts([0, 2, 4, 6], blocks.device, (1, 1, 4, 1))).reshape(n, 16, 16) & 3
    qh = (hmask.reshape(n, -1, 1, 32) >> _shifts(list(range(8)), blocks.device, (1, 1, 8, 1))).reshape(n, 16, 16) & 1
    qh = qh ^ 1  # the offset is 4 where the mask bit is 0 (gguf-py: "strangely")
    q = (ql.to(torch.int8) - (qh << 2).to(torch.int8)).to(torch.float32)
    return (dl * q).reshape(n, QK_K)


_E2M1_DOUBLED = (0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12)  # MXFP4's values, times 2


def _mxfp4(blocks: torch.Tensor) -> torch.Tensor:
    """gpt-oss's experts: an e8m0 exponent byte (as half its power of two), 32 e2m1 nibbles."""
    e = blocks[:, :1].to(torch.int64)
    bits = torch.where(e < 2, 0x00200000 << e, (e - 1) << 23)  # ggml_e8m0_to_fp32_half
    d = bits.to(torch.int32).view(torch.float32)
    values = torch.tensor(_E2M1_DOUBLED, dtype=torch.int8, device=blocks.device)
    return d * values[_nibbles(blocks[:, 1:]).long()].to(torch.float32)


_BLOCKS = {"mxfp4": _mxfp4, "q4_0": _q4_0, "q4_1": _q4_1, "q5_0": _q5_0, "q5_1": _q5_1, "q8_0": _q8_0,
           "q2_k": _q2_k, "q3_k": _q3_k, "q4_k": _q4_k, "q5_k": _q5_k, "q6_k": _q6_k}
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
