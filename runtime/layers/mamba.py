"""Mamba (v1): the selective state-space mixer of AI21's Jamba, with the per-sequence state it
carries between calls.

x [T, H] is projected to the scan's input and a gate, each [T, I] (`in_proj`, I = mamba_expand x
H); the input runs through a SiLU'd depthwise causal convolution (u), and `x_proj` gives each
token a time-step rank R and B, C [T, N], each RMS-normalized (Jamba's dt/B/C norms); `dt_proj`
lifts the time step to [T, I]. Per channel i, with dt = softplus(dt + dt_bias) and A = -exp(A_log)
[I, N], the state S [I, N] moves as

    S = exp(dt A) S + dt B u;  y = S C + D u

and the output is out_proj(y * silu(gate)). A prompt is the scan token by token, a decode step
the rule once; both follow transformers' torch path (`mamba_selective_scan`'s recurrent loop,
`mamba_selective_state_update`) op for op, in float32. The state is the conv's last K - 1 inputs
and S: a recurrent mixer (it cannot rewind), checkpointed to the host like the others.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial
from typing import ClassVar

import torch
import torch.nn.functional as F

from ..config import ModelConfig, UnsupportedFamilyError, config_value
from ..loading.read_ftw import ModelWeights
from .attention import DevicePosition, Start
from .gated_deltanet import causal_conv1d
from .linear import linear
from .norm import rms_norm
from .recurrent_state import ConvMatrixState

# prompt tokens whose discretized A and B u are made at once ([tokens, I, N] float32 each: 64 MiB
# apiece at Jamba's I = 8192, N = 16); the scan then walks them one by one
SCAN_BLOCK_TOKENS = 128


class MambaState(ConvMatrixState):
    """A Mamba layer's state: the conv's last inputs [I, K - 1] and the SSM state [I, state_size]
    (`recurrent`, float32 as the scan computes it)."""

    described_as: ClassVar[str] = "Mamba state"


@dataclass(frozen=True)
class MambaSizes:
    """A Mamba layer's sizes from the config's `mamba_*` keys (JambaConfig's names and defaults)."""

    inner: int
    state_size: int
    kernel: int
    dt_rank: int

    @staticmethod
    def of(c: ModelConfig | dict) -> MambaSizes:
        get = partial(config_value, c)
        hidden = int(c.get("hidden_size"))
        rank = get("mamba_dt_rank", "auto")
        return MambaSizes(int(get("mamba_expand", 2)) * hidden, int(get("mamba_d_state", 16)),
                          int(get("mamba_d_conv", 4)), math.ceil(hidden / 16) if rank == "auto" else int(rank))


def discretize(u: torch.Tensor, dt: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """u/dt [T, I] (dt after bias and softplus), a [I, N], b [T, N]; float32. Returns (exp(dt A),
    dt B u), each [T, I, N], as transformers' scan makes them."""
    return torch.exp(a[None] * dt[..., None]), (dt[..., None] * b[:, None, :]) * u[..., None]


def selective_scan(u: torch.Tensor, dt: torch.Tensor, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor,
                   d: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
    """u/dt [T, I], a [I, N], b/c [T, N], d [I]; float32. `state` [I, N] moved on in place, token by
    token. Returns y [T, I] with D's skip (before the gate)."""
    ys = []
    for first in range(0, u.shape[0], SCAN_BLOCK_TOKENS):
        end = first + SCAN_BLOCK_TOKENS
        decay, inputs = discretize(u[first:end], dt[first:end], a, b[first:end])
        for t in range(decay.shape[0]):
            state.copy_(decay[t] * state + inputs[t])
            ys.append(torch.matmul(state, c[first + t, :, None])[:, 0])
    return torch.stack(ys) + u * d


def state_step(u: torch.Tensor, dt: torch.Tensor, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor,
               d: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
    """One token: u/dt [I] (dt after bias and softplus), b/c [N]; `state` [I, N] moved on in place
    (transformers' `mamba_selective_state_update`). Returns y [I] with D's skip."""
    decay, inputs = discretize(u[None], dt[None], a, b[None])
    state.mul_(decay[0]).add_(inputs[0])
    return torch.matmul(state, c[:, None])[:, 0] + u * d


class MambaMixer:
    """The mixer of a Jamba "mamba" layer (`prefix`: its `mamba.` module: in_proj, conv1d, x_proj,
    dt_layernorm, b_layernorm, c_layernorm, dt_proj, A_log, D, out_proj)."""

    takes_device_position = True  # a decode call may be captured in a CUDA graph (base.Mixer)
    recurrent = True  # its state moves with every token and cannot be moved back (base.Mixer)
    chunks_prompt = True  # a long prompt may come in chunks, each continuing the state (base.Mixer)

    def __init__(self, config: ModelConfig, weights: ModelWeights, prefix: str, dtype: torch.dtype) -> None:
        if config.get("hidden_act", "silu") != "silu":
            raise UnsupportedFamilyError(f"a Mamba layer with hidden_act {config.get('hidden_act')!r}: ft runs silu")
        self.sizes = MambaSizes.of(config)
        self.in_proj, self.in_bias = weights.get(prefix + "in_proj.weight"), weights.maybe(prefix + "in_proj.bias")
        self.out_proj, self.out_bias = weights.get(prefix + "out_proj.weight"), weights.maybe(prefix + "out_proj.bias")
        conv = weights.get(prefix + "conv1d.weight")  # [I, 1, K] as nn.Conv1d stores a depthwise kernel
        self.conv, self.conv_bias = conv.reshape(conv.shape[0], conv.shape[-1]), weights.maybe(prefix + "conv1d.bias")
        self.x_proj = weights.get(prefix + "x_proj.weight")
        self.dt_norm, self.b_norm, self.c_norm = (weights.get(f"{prefix}{n}_layernorm.weight") for n in ("dt", "b", "c"))
        self.dt_proj, self.dt_bias = weights.get(prefix + "dt_proj.weight"), weights.get(prefix + "dt_proj.bias")
        self.a_log, self.d = weights.get(prefix + "A_log"), weights.get(prefix + "D")
        self.eps, self.dtype = config.rms_norm_eps, dtype

    def new_cache(self, max_tokens: int) -> MambaState:
        s = self.sizes
        return MambaState(torch.zeros(s.inner, s.kernel - 1, dtype=self.dtype),
                          torch.zeros(s.inner, s.state_size, dtype=torch.float32))

    def __call__(self, x: torch.Tensor, positions: torch.Tensor, cache: MambaState, start: Start) -> torch.Tensor:
        """A prompt (T > 1) by the scan from the state, a token by one step; the state updated in
        place, so a CUDA graph captured over it stays valid; at a DevicePosition its host `length`
        is left to the caller."""
        cache.seek(start)
        s, t = self.sizes, x.shape[0]
        u, gate = linear(x, self.in_proj, self.in_bias).chunk(2, dim=-1)  # [T, I] each
        u, conv = causal_conv1d(u, cache.conv, self.conv, self.conv_bias)
        cache.conv.copy_(conv)
        dt, b, c = linear(u, self.x_proj).split([s.dt_rank, s.state_size, s.state_size], dim=-1)
        dt, b, c = rms_norm(dt, self.dt_norm, self.eps), rms_norm(b, self.b_norm, self.eps), rms_norm(c, self.c_norm, self.eps)
        # dt_proj's weight alone, its bias added in float32 with the softplus (transformers' delta_bias)
        dt = F.softplus(torch.matmul(dt, self.dt_proj.transpose(0, 1)).float() + self.dt_bias.float())  # [T, I]
        a, d, u = -self.a_log.float().exp(), self.d.float(), u.float()
        if t == 1:
            y = state_step(u[0], dt[0], a, b[0].float(), c[0].float(), d, cache.recurrent)[None]
        else:
            y = selective_scan(u, dt, a, b.float(), c.float(), d, cache.recurrent)
        if not isinstance(start, DevicePosition):
            cache.length = start + t
        y = y * F.silu(gate.float())
        return linear(y.to(x.dtype), self.out_proj, self.out_bias)
