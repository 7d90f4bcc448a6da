"""Turning stored weights into compute weights: float casts, FP8 block scales, GGML block quants.

This is the reference path (plain torch / gguf-py): correct for every FTW dtype and used to test
the fast kernels against.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from ftw.format import BLOCK_DTYPES

FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)


def dequantize(
    raw: torch.Tensor,
    dtype_name: str,
    shape: tuple[int, ...],
    out_dtype: torch.dtype,
    *,
    scales: list[torch.Tensor] | None = None,
    block: tuple[int, int] = (128, 128),
) -> torch.Tensor:
    """`raw` as a `shape` tensor of `out_dtype`.

    FP8 with `scales`: each [block x block] tile is multiplied by its scale (DeepSeek's
    `weight_scale_inv`); several scale tensors cover consecutive row ranges (w13 = w1 rows then
    w3 rows, each with its own scales).
    """
    if dtype_name in BLOCK_DTYPES:
        return _dequantize_ggml(raw, dtype_name, shape).to(out_dtype)
    if raw.dtype in FP8 and scales:
        return _dequantize_fp8(raw, scales, block).to(out_dtype)
    return raw.to(out_dtype)


def _dequantize_fp8(w: torch.Tensor, scales: list[torch.Tensor], block: tuple[int, int]) -> torch.Tensor:
    rows_per_scale = w.shape[0] // len(scales)
    out = torch.empty(w.shape, dtype=torch.float32, device=w.device)
    for i, scale in enumerate(scales):
        part = w[i * rows_per_scale : (i + 1) * rows_per_scale].to(torch.float32)
        r, c = part.shape
        expanded = scale.to(torch.float32).repeat_interleave(block[0], 0).repeat_interleave(block[1], 1)[:r, :c]
        out[i * rows_per_scale : (i + 1) * rows_per_scale] = part * expanded
    return out


def _dequantize_ggml(raw: torch.Tensor, dtype_name: str, shape: tuple[int, ...]) -> torch.Tensor:
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize as gguf_dequantize

    qtype = GGMLQuantizationType[dtype_name.upper()]
    values = gguf_dequantize(np.ascontiguousarray(raw.numpy()), qtype)
    return torch.from_numpy(np.ascontiguousarray(values, dtype=np.float32)).view(math.prod(shape[:-1]), shape[-1]).view(shape)
