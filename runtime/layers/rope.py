"""Rotary position embeddings: inverse frequencies per rope type, and their application.

Frequencies follow transformers' `modeling_rope_utils` (default, linear, yarn); `apply_rotary`
is the rotate-half form most families use, on the first `rotary_dim` channels;
`apply_rotary_interleaved` is DeepSeek's pairwise form (MLA, the DSA indexer).

Every attention layer asks for the cos/sin tables of the same positions in a forward pass. A
pass that calls `forward_begins` first (DecoderModel does) computes them once and hands the
same tables to every layer after the first: nine small kernels a layer fewer in a GPU decode
step. The tables are reused only within that pass, on that thread, for the same positions
tensor, which nothing changes during a pass.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from typing import Any

import torch

from ..config import ModelConfig, UnsupportedFamilyError

_pass = threading.local()  # `number`: the forward pass under way on this thread (forward_begins)


def forward_begins() -> None:
    """A forward pass begins on this thread: tables computed before it are not reused."""
    _pass.number = getattr(_pass, "number", 0) + 1


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
    raise UnsupportedFamilyError(f"rope type {kind!r} is not supported yet (default, linear and yarn are)")


def _yarn(dim: int, base: float, params: dict[str, Any], max_positions: int) -> tuple[torch.Tensor, float]:
    original = int(params.get("original_max_position_embeddings") or max_positions)
    # DeepSeek-style configs may leave `factor` out: transformers then uses the context ratio
    factor = float(params.get("factor") or max_positions / original)
    mscale, mscale_all_dim = params.get("mscale"), params.get("mscale_all_dim")

    attention_factor = params.get("attention_factor")
    if attention_factor is None:
        if mscale and mscale_all_dim:
            attention_factor = yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all_dim)
        else:
            attention_factor = yarn_mscale(factor)
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


def yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    """YaRN's magnitude correction for a context `factor` (transformers' `get_mscale`)."""
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


class RotaryEmbedding:
    """cos/sin tables for positions, computed on demand (float32, as transformers does)."""

    def __init__(self, rotary_dim: int, params: dict[str, Any], max_positions: int) -> None:
        self.rotary_dim = rotary_dim
        self.inv_freq, self.scaling = inverse_frequencies(rotary_dim, params, max_positions)
        self._last = threading.local()  # `tables`: (pass, positions, dtype, (cos, sin)) of this thread's last call

    def __call__(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        number = getattr(_pass, "number", None)
        last = getattr(self._last, "tables", None)
        if number is not None and last is not None and last[0] == number and last[1] is positions and last[2] == dtype:
            return last[3]
        freqs = positions.to(torch.float32)[:, None] * self.inv_freq[None, :]  # [T, rotary_dim/2]
        emb = torch.cat((freqs, freqs), dim=-1)
        tables = (emb.cos() * self.scaling).to(dtype), (emb.sin() * self.scaling).to(dtype)
        self._last.tables = (number, positions, dtype, tables) if number is not None else None
        return tables


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def partial_rotary(config: ModelConfig, default_factor: float) -> RotaryEmbedding:
    """RoPE on each head's first `partial_rotary_factor` of channels: the factor in
    `rope_parameters` as transformers 5 writes it, else beside it as config.json has it (GLM's,
    Qwen3.5's), else the family's default (transformers' where the config names none)."""
    params = config.rope_parameters
    factor = params.get("partial_rotary_factor", config.get("partial_rotary_factor", default_factor))
    return RotaryEmbedding(int(config.head_dim * float(factor)), params, config.context_length)


# (supports, kernel): set by the GPU runtime when a model runs on the GPU (DeviceModel)
_device_kernel: tuple[Callable[..., bool], Callable[..., torch.Tensor]] | None = None


def use_device_kernel(supports: Callable[..., bool], kernel: Callable[..., torch.Tensor]) -> None:
    """From now on, `apply_rotary(x, cos, sin)` is `kernel(x, cos, sin)` wherever
    `supports(x, cos, sin)` (a fused kernel of the same computation: runtime/gpu/kernels/rotary.py)."""
    global _device_kernel
    _device_kernel = (supports, kernel)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [T, heads, D]; cos/sin [T, R] with R <= D: the first R channels rotate, the rest pass."""
    if _device_kernel is not None and _device_kernel[0](x, cos, sin):
        return _device_kernel[1](x, cos, sin)
    rot = cos.shape[-1]
    cos, sin = cos[:, None, :], sin[:, None, :]
    if rot == x.shape[-1]:
        return x * cos + rotate_half(x) * sin
    head, tail = x[..., :rot], x[..., rot:]
    return torch.cat((head * cos + rotate_half(head) * sin, tail), dim=-1)


def apply_rotary_interleaved(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [T, heads, R], rotated as pairs (x0, x1), (x2, x3), ...; cos/sin [T, R] from `RotaryEmbedding`.

    Like transformers' `apply_rotary_pos_emb_interleave`, the result comes out de-interleaved
    (rotated evens, then rotated odds): queries and keys get the same permutation, so their dot
    products are those of the interleaved layout, and cached keys must stay in this layout.
    """
    half = cos.shape[-1] // 2
    cos, sin = cos[:, None, :half], sin[:, None, :half]  # cat(freqs, freqs): the first half has each angle
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
