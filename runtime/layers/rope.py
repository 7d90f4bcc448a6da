"""Rotary position embeddings: inverse frequencies per rope type, and their application.

Frequencies follow transformers' `modeling_rope_utils` (default, linear, yarn, longrope, llama3,
proportional); `apply_rotary` is the rotate-half form most families use, on the first `rotary_dim`
channels; `apply_rotary_interleaved` is DeepSeek's pairwise form (MLA, the DSA indexer).

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
from ..experts.cpu_kernels import ROW_DTYPE_CODES, native_kernel

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
    if kind == "llama3":
        return _llama3(inv_freq, params), 1.0
    if kind == "dynamic" and params.get("alpha"):
        # Hunyuan's NTK-alpha, labelled "dynamic" in its checkpoints: a fixed `alpha` stretches the base
        # alone, so the frequencies do not move with the length (transformers' HunYuan "ntk_alpha")
        base *= float(params["alpha"]) ** (rotary_dim / (rotary_dim - 2))
        return 1.0 / (base ** (torch.arange(0, rotary_dim, 2, dtype=torch.int64).to(torch.float32) / rotary_dim)), 1.0
    if kind == "longrope":  # (the short frequencies: RotaryEmbedding switches to the long ones past the original context)
        return _longrope(rotary_dim, base, params, max_positions, long=False)
    if kind == "proportional":
        return _proportional(rotary_dim, base, params), 1.0
    raise UnsupportedFamilyError(f"rope type {kind!r} is not supported yet (default, linear, yarn, longrope, llama3 "
                                 "and proportional are)")


def _proportional(head_dim: int, base: float, params: dict[str, Any]) -> torch.Tensor:
    """Gemma 4's proportional RoPE over a whole head of `head_dim` channels: the first
    `partial_rotary_factor` of its frequency pairs at the whole head's spacing (base ** (2i / head_dim)),
    the rest 0, so with rotate-half channels i and i + head_dim / 2 turn for i below that many and
    the others pass (transformers' `_compute_proportional_rope_parameters`), all divided by `factor`."""
    angles = int(float(params.get("partial_rotary_factor", 1.0)) * head_dim // 2)
    exponents = torch.arange(0, 2 * angles, 2, dtype=torch.int64).to(torch.float32) / head_dim
    inv_freq = torch.cat((1.0 / (base ** exponents), torch.zeros(head_dim // 2 - angles)))
    return inv_freq / float(params.get("factor", 1.0))


def _longrope(dim: int, base: float, params: dict[str, Any], max_positions: int, *,
              long: bool) -> tuple[torch.Tensor, float]:
    """LongRoPE (Phi-3, Phi-3.5-MoE): each frequency divided by its own factor, `short_factor`'s
    within `original_max_position_embeddings` and `long_factor`'s past it; cos/sin scaled by
    `short_mscale`/`long_mscale` where the config has them (Phi-3.5-MoE's), else by transformers'
    attention factor."""
    which = "long" if long else "short"
    original = int(params["original_max_position_embeddings"])
    factors = torch.tensor([float(f) for f in params[f"{which}_factor"]], dtype=torch.float32)
    if factors.numel() != dim // 2:
        raise ValueError(f"rope_scaling {which}_factor has {factors.numel()} factors, not one per frequency "
                         f"({dim // 2}); the config is damaged")
    inv_freq = 1.0 / (factors * base ** (torch.arange(0, dim, 2, dtype=torch.int64).to(torch.float32) / dim))
    mscale = params.get(f"{which}_mscale")
    if mscale is not None:
        return inv_freq, float(mscale)
    attention_factor = params.get("attention_factor")
    if attention_factor is None:
        factor = float(params.get("factor") or max_positions / original)
        attention_factor = 1.0 if factor <= 1 else math.sqrt(1 + math.log(factor) / math.log(original))
    return inv_freq, float(attention_factor)


def _llama3(inv_freq: torch.Tensor, params: dict[str, Any]) -> torch.Tensor:
    """Llama 3.1's (and Llama 4's) scaling: wavelengths beyond `original / low_freq_factor` divided
    by `factor`, those under `original / high_freq_factor` kept, the ones between interpolated
    (transformers' `_compute_llama3_parameters`; where the two bounds meet, nothing is between)."""
    factor, low, high = float(params["factor"]), float(params["low_freq_factor"]), float(params["high_freq_factor"])
    original = float(params["original_max_position_embeddings"])
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > original / low, inv_freq / factor, inv_freq)
    smooth = (original / wavelen - low) / (high - low) if high != low else torch.zeros_like(wavelen)
    medium = (wavelen >= original / high) & (wavelen <= original / low)
    return torch.where(medium, (1 - smooth) * scaled / factor + smooth * scaled, scaled)


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


def query_temperature(positions: torch.Tensor, floor_scale: float, beta: float, *, offset: float) -> torch.Tensor:
    """Llama 4's query temperature (arXiv 2501.19399), a factor a position [T] (float32) that grows
    every `floor_scale` positions: 1 + beta * log(1 + floor((p + offset) / floor_scale)). Llama 4's
    NoPE layers count positions from 1 (offset 1), Mistral 4's attention from 0 (transformers'
    `get_llama_4_attn_scale`)."""
    return torch.log1p(torch.floor((positions.to(torch.float32) + offset) / floor_scale)) * beta + 1.0


def log_length_query_scale(positions: torch.Tensor, length: float = 2048.0, power: float = 0.1) -> torch.Tensor:
    """Scalable-softmax's query scale a position [T] (float32), growing slowly with the context it
    attends over: (1 + (p + 1) / length) ** power, as exp(power * log1p(...)) (Beam's NoPE layers,
    transformers' `compute_attention_scaling`)."""
    return torch.exp(power * torch.log1p((positions.to(torch.float32) + 1) / length))


class RotaryEmbedding:
    """cos/sin tables for positions, computed on demand (float32, as transformers does).

    LongRoPE has a second set of frequencies: a call whose last position is past the original
    context (max(positions) + 1 > original_max_position_embeddings) takes the long ones for all
    its positions, as Phi-3.5-MoE's released code and transformers 4 chose them (by the sequence
    length so far: keys cached before the switch keep their short rotation). transformers 5.24's
    Phimoe switches only the scale, never the frequencies. The choice is made on the device
    (`torch.where`), so a decode step stays capturable."""

    def __init__(self, rotary_dim: int, params: dict[str, Any], max_positions: int) -> None:
        self.rotary_dim = rotary_dim
        self.inv_freq, self.scaling = inverse_frequencies(rotary_dim, params, max_positions)
        self.long: tuple[torch.Tensor, float] | None = None  # (inv_freq, scaling) past `original` (LongRoPE)
        self.original = 0
        if params.get("rope_type") == "longrope":
            self.long = _longrope(rotary_dim, float(params.get("rope_theta", 10000.0)), params, max_positions, long=True)
            self.original = int(params["original_max_position_embeddings"])
        self._last = threading.local()  # `tables`: (pass, positions, dtype, (cos, sin)) of this thread's last call

    def __call__(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        number = getattr(_pass, "number", None)
        last = getattr(self._last, "tables", None)
        if number is not None and last is not None and last[0] == number and last[1] is positions and last[2] == dtype:
            return last[3]
        tables = self._tables(positions, self.inv_freq, self.scaling, dtype)
        if self.long is not None:
            long = self._tables(positions, *self.long, dtype)
            past = positions.max() >= self.original  # [] on the positions' device: no host sync
            tables = torch.where(past, long[0], tables[0]), torch.where(past, long[1], tables[1])
        self._last.tables = (number, positions, dtype, tables) if number is not None else None
        return tables

    @staticmethod
    def _tables(positions: torch.Tensor, inv_freq: torch.Tensor, scaling: float,
                dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions.to(torch.float32)[:, None] * inv_freq[None, :]  # [T, rotary_dim/2]
        emb = torch.cat((freqs, freqs), dim=-1)
        return (emb.cos() * scaling).to(dtype), (emb.sin() * scaling).to(dtype)


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


def whole_head_rope(config: ModelConfig, family: str) -> RotaryEmbedding:
    """The config's RoPE over whole heads, for a family whose transformers code rotates every
    channel whatever `partial_rotary_factor` says (Flint, Kolibri 1, Doge, Lara-4-Mini): a factor
    below 1 is refused by name rather than run as a rotation transformers does not make."""
    params = config.rope_parameters
    if float(params.get("partial_rotary_factor", 1.0)) != 1.0:
        raise UnsupportedFamilyError(f"{family} with a partial_rotary_factor below 1 is not supported")
    return RotaryEmbedding(config.head_dim, params, config.context_length)


def ropes_by_layer_type(config: ModelConfig, types: list[str], defaults: dict[str, dict[str, Any]],
                        family: str, head_dims: dict[str, int] | None = None) -> dict[str, RotaryEmbedding]:
    """Each layer type's RoPE, as transformers' per-type rotary embeddings (Laguna's, Mellum's,
    Gemma 4's) make them: `rope_parameters` keyed by layer type (one for each type in `types`, none
    other than the family's `defaults` know), else `defaults`; each type on its heads' first
    `partial_rotary_factor` of channels (all where it names none; a proportional rope spans the whole
    head and takes the factor itself). `head_dims`: a type's head size where it is not the config's
    head_dim (Gemma 4's full layers)."""
    params = config.get("rope_parameters")
    if params is None:
        params = defaults
    if not isinstance(params, dict) or not set(types) <= set(params) <= set(defaults):
        raise UnsupportedFamilyError(f"{family} needs rope_parameters per layer type ({', '.join(defaults)}), as "
                                     f"transformers reads them; the config has {str(params)[:80]}")
    ropes = {}
    for kind, p in params.items():
        p = {**p, "rope_type": p.get("rope_type", "default")}
        head_dim = (head_dims or {}).get(kind, config.head_dim)
        factor = 1.0 if p["rope_type"] == "proportional" else float(p.get("partial_rotary_factor", 1.0))
        ropes[kind] = RotaryEmbedding(int(head_dim * factor), p, config.context_length)
    return ropes


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
    if _cpu_kernel_takes(x, cos, sin):
        kernel = native_kernel()
        if kernel is not None:
            return kernel.rotary(x, cos, sin, torch.get_num_threads())
    rot = cos.shape[-1]
    cos, sin = cos[:, None, :], sin[:, None, :]
    if rot == x.shape[-1]:
        return x * cos + rotate_half(x) * sin
    head, tail = x[..., :rot], x[..., rot:]
    return torch.cat((head * cos + rotate_half(head) * sin, tail), dim=-1)


def _cpu_kernel_takes(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> bool:
    """Whether the CPU kernel rotates x [T, heads, D] by cos/sin [T, R]: contiguous, one dtype it
    takes, R even and at most D (csrc/rows.cpp's ft_rotary: one call where torch's form makes ~7)."""
    return (x.is_cpu and x.dtype in ROW_DTYPE_CODES and x.dim() == 3 and x.is_contiguous()
            and cos.dtype == x.dtype and sin.dtype == x.dtype and cos.dim() == 2 and cos.shape == sin.shape
            and cos.shape[0] == x.shape[0] and cos.shape[1] % 2 == 0 and cos.shape[1] <= x.shape[2]
            and cos.is_contiguous() and sin.is_contiguous())


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


def apply_rotary_pairs(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [T, heads, D]; cos/sin [T, R] from `RotaryEmbedding` (R <= D): the last R channels rotate
    as pairs (x[D-R], x[D-R+1]), ... and stay in place, in float32, as DeepSeek-V4 does
    (transformers' `apply_rotary_pos_emb` of deepseek_v4). Unlike `apply_rotary_interleaved` the
    layout is kept: V4's values are its keys, and the attention output's rotated channels are
    turned back (sin negated) before the output projection reads them."""
    rot = cos.shape[-1]
    cos = cos[:, None, : rot // 2].repeat_interleave(2, dim=-1)  # cat(freqs, freqs): each angle once, per pair
    sin = sin[:, None, : rot // 2].repeat_interleave(2, dim=-1)
    head, tail = x[..., : x.shape[-1] - rot], x[..., x.shape[-1] - rot :]
    pairs = tail.float()
    turned = torch.stack((-pairs[..., 1::2], pairs[..., 0::2]), dim=-1).flatten(-2)  # (-x1, x0) per pair
    return torch.cat((head, (pairs * cos + turned * sin).to(x.dtype)), dim=-1)
