"""Rotary position embeddings: inverse frequencies per rope type, and their application.

Frequencies follow transformers' `modeling_rope_utils` (default, linear, yarn); `apply_rotary`
is the rotate-half form every family here uses, on the first `rotary_dim` channels.
"""

from __future__ import annotations

import math
from typing import Any

import torch


def inverse_frequencies(rotary_dim: int, params: dict[str, Any], max_positions: int) -> tuple[torch.Tensor, float]:
    """(inv_freq [rotary_dim/2], attention scaling factor applied to cos/sin)."""
    base = float(params.get("rope_theta", 10000.0))
    inv_freq = 1.0 / (base ** (torch.arange(0, rotary_dim, 2, dtype=torch.int64).to(torch.float32) / rotary_dim))
    kind = params.get("rope_type", "default")
    if kind == "default":
        return inv_freq, 1.0
    if kind == "linear":
        return inv_freq / float(params["factor"]), 1.0
    if kind == "yarn":
        return _yarn(rotary_dim, base, params, max_positions)
    raise NotImplementedError(f"rope type {kind!r} is not supported yet")


def _yarn(dim: int, base: float, params: dict[str, Any], max_positions: int) -> tuple[torch.Tensor, float]:
    factor = float(params["factor"])
    original = int(params.get("original_max_position_embeddings") or max_positions)
    mscale, mscale_all_dim = params.get("mscale"), params.get("mscale_all_dim")

    def get_mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    if mscale and mscale_all_dim:
        attention_factor = get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim)
    else:
        attention_factor = params.get("attention_factor") or get_mscale(factor)
    beta_fast, beta_slow = float(params.get("beta_fast") or 32), float(params.get("beta_slow") or 1)

    def correction_dim(rotations: float) -> float:
        return (dim * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if params.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    pos_freqs = base ** (torch.arange(0, dim, 2).to(torch.float32) / dim)
    extrapolation, interpolation = 1.0 / pos_freqs, 1.0 / (factor * pos_freqs)
    extrapolation_factor = 1 - ramp
    inv_freq = interpolation * (1 - extrapolation_factor) + extrapolation * extrapolation_factor
    return inv_freq, float(attention_factor)


class RotaryEmbedding:
    """cos/sin tables for positions, computed on demand (float32, as transformers does)."""

    def __init__(self, rotary_dim: int, params: dict[str, Any], max_positions: int) -> None:
        self.rotary_dim = rotary_dim
        self.inv_freq, self.scaling = inverse_frequencies(rotary_dim, params, max_positions)

    def __call__(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions.to(torch.float32)[:, None] * self.inv_freq[None, :]  # [T, rotary_dim/2]
        emb = torch.cat((freqs, freqs), dim=-1)
        return (emb.cos() * self.scaling).to(dtype), (emb.sin() * self.scaling).to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [T, heads, D]; cos/sin [T, R] with R <= D: the first R channels rotate, the rest pass."""
    rot = cos.shape[-1]
    cos, sin = cos[:, None, :], sin[:, None, :]
    if rot == x.shape[-1]:
        return x * cos + rotate_half(x) * sin
    head, tail = x[..., :rot], x[..., rot:]
    return torch.cat((head * cos + rotate_half(head) * sin, tail), dim=-1)
