"""Gated DeltaNet: the linear-attention mixer of Qwen3.5 (and, with its own projection split,
Qwen3-Next), with the per-sequence state it carries between calls.

A layer projects x into q/k/v (through a short causal depthwise conv), a gate z, and per-head
beta (write strength) and g (log decay). Its state is a matrix per value head, S [Dk, Dv],
updated per token by the gated delta rule

    S = exp(g) * S;  S += k (beta * (v - k S))^T;  out = q S

Prefill runs the chunked form (a UT transform per 64-token chunk, then a scan over chunks);
decode runs the rule one token at a time. Both follow transformers' torch fallbacks
(`torch_chunk_gated_delta_rule`, `torch_recurrent_gated_delta_rule`) op for op, in float32.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

import torch
import torch.nn.functional as F

from ..config import ModelConfig, UnsupportedFamilyError
from ..loading.read_ftw import ModelWeights
from .attention import DevicePosition, Start
from .linear import linear
from .norm import rms_norm
from .recurrent_state import ConvMatrixState

CHUNK_SIZE = 64


class DeltaNetState(ConvMatrixState):
    """A Gated DeltaNet (or KDA) layer's state: the conv's last inputs and the delta-rule
    matrices [v_heads, k_head_dim, v_head_dim]."""

    described_as: ClassVar[str] = "linear-attention state"


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    # rsqrt(sum + eps), not x / max(norm, eps): the form transformers (and FLA) use
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)


def causal_conv1d(x: torch.Tensor, state: torch.Tensor, weight: torch.Tensor,
                  bias: torch.Tensor | None, *, silu: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """SiLU(depthwise causal conv) of x [T, C] after the `state` [C, K-1] inputs before it (`silu`
    false: the conv alone, LFM2's short convolution). Returns (out [T, C], the new state). A zero
    state is transformers' left zero padding."""
    channels, width = weight.shape
    seq = torch.cat([state, x.transpose(0, 1).to(state.dtype)], dim=-1)  # [C, K-1+T]
    out = F.conv1d(seq[None].to(weight.dtype), weight[:, None, :], bias, groups=channels)[0]  # [C, T]
    out = F.silu(out) if silu else out
    return out.transpose(0, 1).to(x.dtype), seq[:, seq.shape[1] - (width - 1):].clone()


def chunk_gated_delta_rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                           state: torch.Tensor, chunk_size: int = CHUNK_SIZE) -> tuple[torch.Tensor, torch.Tensor]:
    """q/k [H, T, Dk] (normalized, q scaled), v [H, T, Dv], g/beta [H, T], state [H, Dk, Dv]; all float32.
    Returns (out [H, T, Dv], final state)."""
    heads, t, _ = k.shape
    pad = (chunk_size - t % chunk_size) % chunk_size
    # zero padding is inert: k = 0 writes nothing and g = 0 decays nothing
    q, k, v = (F.pad(x, (0, 0, 0, pad)) for x in (q, k, v))
    g, beta = (F.pad(x, (0, pad)) for x in (g, beta))
    n = (t + pad) // chunk_size
    v_beta, k_beta = v * beta[..., None], k * beta[..., None]
    q, k, k_beta, v_beta = (x.reshape(heads, n, chunk_size, -1) for x in (q, k, k_beta, v_beta))  # [H, N, C, D]
    decay = g.reshape(heads, n, chunk_size).cumsum(dim=-1)  # [H, N, C]: log decay from the chunk start
    upper = torch.ones(chunk_size, chunk_size, dtype=torch.bool).triu(1)
    pairwise = (decay[..., :, None] - decay[..., None, :]).masked_fill(upper, float("-inf")).exp()  # [H, N, C, C]

    # UT transform: solve (I + strictly-lower(beta k k^T decay)) X = v_beta, and = k_beta decay, per chunk
    ut_system = (k_beta @ k.transpose(-1, -2)) * pairwise
    intra = (q @ k.transpose(-1, -2)) * pairwise
    new_values = torch.linalg.solve_triangular(ut_system, v_beta, upper=False, unitriangular=True)
    k_cumdecay = torch.linalg.solve_triangular(ut_system, k_beta * decay.exp()[..., None], upper=False,
                                               unitriangular=True)
    q = q * decay.exp()[..., None]
    k = k * (decay[..., -1:] - decay).exp()[..., None]
    chunk_decay = decay[..., -1].exp()[..., None, None]  # [H, N, 1, 1]

    out = torch.empty_like(new_values)
    for i in range(n):  # the scan over chunks: read the state, then write the chunk's corrections
        v_new = new_values[:, i] - k_cumdecay[:, i] @ state
        out[:, i] = q[:, i] @ state + intra[:, i] @ v_new
        state = state * chunk_decay[:, i] + k[:, i].transpose(-1, -2) @ v_new
    return out.reshape(heads, n * chunk_size, -1)[:, :t], state


def recurrent_gated_delta_rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                               beta: torch.Tensor, state: torch.Tensor,
                               in_place: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """The same rule token by token (decode); same shapes as `chunk_gated_delta_rule`.
    `in_place`: `state` itself is updated and returned (a decode step's state, whose buffer a
    captured CUDA graph holds: no copy of its 2 MiB a layer per token)."""
    if not in_place:
        state = state.clone()
    out = torch.empty_like(v)
    for i in range(k.shape[1]):
        q_t, k_t, v_t = q[:, i], k[:, i], v[:, i]  # [H, D]
        state.mul_(g[:, i].exp()[:, None, None])
        memory = (state * k_t[..., None]).sum(dim=-2)  # [H, Dv]: what the state predicts for k_t
        delta = (v_t - memory) * beta[:, i, None]
        state.add_(k_t[..., None] * delta[:, None, :])
        out[:, i] = (state * q_t[..., None]).sum(dim=-2)
    return out, state


def gated_delta_rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                     state: torch.Tensor, *, chunked: bool, in_place: bool = False,
                     tiled: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """q/k [T, Hk, Dk], v [T, Hv, Dv], g/beta [T, Hv], state [Hv, Dk, Dv] float32 -> (out [T, Hv, Dv] in v's
    dtype, new state). Each q/k head serves Hv/Hk consecutive value heads (`tiled`: value head j is
    q/k head j mod Hk's, the order llama.cpp's GGUF files store the value heads in). `in_place`: the
    new state is written into `state`, which is returned."""
    dtype = q.dtype
    groups = v.shape[1] // k.shape[1]
    if groups > 1 and tiled:
        q, k = q.repeat(1, groups, 1), k.repeat(1, groups, 1)
    elif groups > 1:
        q, k = q.repeat_interleave(groups, dim=1), k.repeat_interleave(groups, dim=1)
    q, k, v, g, beta = (x.transpose(0, 1).to(torch.float32).contiguous() for x in (q, k, v, g, beta))  # heads first
    q, k = l2norm(q), l2norm(k)
    if chunked:
        out, final = chunk_gated_delta_rule(q * q.shape[-1] ** -0.5, k, v, g, beta, state)
        state = state.copy_(final) if in_place else final
    else:
        # transformers divides here and multiplies in the chunked form; mirrored for bit-closeness
        out, state = recurrent_gated_delta_rule(q / q.shape[-1] ** 0.5, k, v, g, beta, state, in_place)
    return out.transpose(0, 1).to(dtype), state


def gated_rms_norm(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float,
                   activation: Callable[[torch.Tensor], torch.Tensor] = F.silu) -> torch.Tensor:
    """weight * normalize(x) * activation(gate) (silu; Qwen4-Exp's `output_gate_type` may be sigmoid): a
    plain (not zero-centred) weight; like transformers, the product with the float32 gate is taken before
    casting back."""
    return (rms_norm(x, weight, eps) * activation(gate.to(torch.float32))).to(x.dtype)


class GatedDeltaNet:
    """The mixer: projections, causal conv, gated delta rule, gated RMSNorm, out_proj.

    Sizes come from the `linear_*` config keys Qwen3.5 and Qwen3-Next share. `project` is Qwen3.5's
    split (separate in_proj_qkv / z / b / a); a family with fused projections overrides it. The
    value heads are grouped by key head as transformers has them, or, where `linear_value_head_order`
    is "tiled" (ft's key, set by the GGUF converter: ftw/gguf_config.py), in llama.cpp's order: every
    tensor indexed by value head (v's rows of in_proj_qkv and the conv, z, a, b, A_log, dt_bias,
    out_proj's columns) stays as the file stores it, and only the key head each value head reads changes.
    """

    takes_device_position = True  # a decode call may be captured in a CUDA graph (base.Mixer)
    recurrent = True  # its state moves with every token and cannot be moved back (base.Mixer)
    chunks_prompt = True  # a long prompt may come in chunks, each continuing the state (base.Mixer)

    def __init__(self, config: ModelConfig, weights: ModelWeights, prefix: str, dtype: torch.dtype) -> None:
        self.k_heads, self.v_heads = int(config.get("linear_num_key_heads")), int(config.get("linear_num_value_heads"))
        self.k_head_dim, self.v_head_dim = int(config.get("linear_key_head_dim")), int(config.get("linear_value_head_dim"))
        self.key_size, self.value_size = self.k_heads * self.k_head_dim, self.v_heads * self.v_head_dim
        self.load_projections(weights, prefix)
        conv = weights.get(prefix + "conv1d.weight")  # [C, 1, K] as nn.Conv1d stores a depthwise kernel
        self.conv = conv.reshape(conv.shape[0], conv.shape[-1])
        self.conv_bias = weights.maybe(prefix + "conv1d.bias")
        self.a_log, self.dt_bias = weights.get(prefix + "A_log"), weights.get(prefix + "dt_bias")
        self.norm, self.out = weights.get(prefix + "norm.weight"), weights.get(prefix + "out_proj.weight")
        self.eps, self.dtype = config.rms_norm_eps, dtype
        self.gate_activation: Callable[[torch.Tensor], torch.Tensor] = F.silu  # (of the output norm's gate)
        order = config.get("linear_value_head_order", "grouped")
        if order not in ("grouped", "tiled"):
            raise UnsupportedFamilyError(f"linear_value_head_order {order!r}: ft reads \"grouped\" or \"tiled\"")
        self.tiled = order == "tiled"

    def load_projections(self, weights: ModelWeights, prefix: str) -> None:
        self.in_qkv, self.in_z, self.in_b, self.in_a = (
            weights.get(f"{prefix}in_proj_{p}.weight") for p in ("qkv", "z", "b", "a"))

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """x [T, H] -> (qkv [T, 2*key_size + value_size] in q|k|v order, z [T, value_size], b [T, Hv], a [T, Hv])."""
        return linear(x, self.in_qkv), linear(x, self.in_z), linear(x, self.in_b), linear(x, self.in_a)

    def new_cache(self, max_tokens: int) -> DeltaNetState:
        conv_dim, width = self.conv.shape
        return DeltaNetState(torch.zeros(conv_dim, width - 1, dtype=self.dtype),
                             torch.zeros(self.v_heads, self.k_head_dim, self.v_head_dim, dtype=torch.float32))

    def __call__(self, x: torch.Tensor, positions: torch.Tensor, cache: DeltaNetState, start: Start,
                 *, chunked: bool | None = None) -> torch.Tensor:
        """`chunked` picks the prefill form; by default chunked for T > 1, token by token for T = 1.
        The state is updated in place, so a CUDA graph captured over it stays valid after uncaptured
        calls (a prefill) too; at a DevicePosition its host `length` is left to the caller (a
        captured step replays only device work)."""
        cache.seek(start)
        t = x.shape[0]
        qkv, z, b, a = self.project(x)
        qkv, conv = causal_conv1d(qkv, cache.conv, self.conv, self.conv_bias)
        cache.conv.copy_(conv)
        q, k, v = qkv.split([self.key_size, self.key_size, self.value_size], dim=-1)
        q, k = q.reshape(t, self.k_heads, self.k_head_dim), k.reshape(t, self.k_heads, self.k_head_dim)
        v = v.reshape(t, self.v_heads, self.v_head_dim)
        beta = b.sigmoid()
        g = -self.a_log.float().exp() * F.softplus(a.float() + self.dt_bias)  # float32, as transformers (fp16: A -> -inf)
        out, _ = gated_delta_rule(q, k, v, g, beta, cache.recurrent, chunked=t > 1 if chunked is None else chunked,
                                  in_place=True, tiled=self.tiled)
        if not isinstance(start, DevicePosition):
            cache.length = start + t
        out = gated_rms_norm(out, z.reshape(t, self.v_heads, self.v_head_dim), self.norm, self.eps,
                             self.gate_activation)
        return linear(out.reshape(t, self.value_size), self.out)
