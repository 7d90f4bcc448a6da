"""Mamba2: the selective state-space mixer of hybrid models (IBM Granite 4.0's "mamba" layers), with
the per-sequence state it carries between calls.

x [T, H] is projected to a gate z [T, I], the convolution's input xBC [T, I + 2GN] and a time step
dt [T, heads] (`in_proj`, I = heads x head_dim); xBC runs through a SiLU'd depthwise causal
convolution and splits into x [T, heads, P], B and C [T, G, N] (each of G groups serves heads / G
heads). Per head h, with dt = softplus(dt + dt_bias) and A = -exp(A_log), the state S [P, N] moves as

    S = exp(dt A) S + dt x B^T;  y = S C + D x

and the output is out_proj(gated_group_rms_norm(y, z)). A prompt runs the chunked (SSD) form, a
decode step the rule once; both follow transformers' torch fallbacks (`mamba2_chunk_scan`,
`mamba2_selective_state_update`) op for op, in float32. The state is the conv's last K - 1 inputs
and S: a recurrent mixer (it cannot rewind), checkpointed to the host like the others.
"""

from __future__ import annotations

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
from .recurrent_state import ConvMatrixState


class Mamba2State(ConvMatrixState):
    """A Mamba2 layer's state: the conv's last inputs and each head's SSM state
    [heads, head_dim, state_size] (`recurrent`, float32 as the scan computes it)."""

    described_as: ClassVar[str] = "Mamba2 state"


@dataclass(frozen=True)
class Mamba2Sizes:
    """A Mamba2 layer's sizes from the config's `mamba_*` keys (GraniteMoeHybridConfig's names and defaults)."""

    heads: int
    head_dim: int
    groups: int
    state_size: int
    kernel: int
    chunk_size: int

    @staticmethod
    def of(c: ModelConfig | dict) -> Mamba2Sizes:
        get = partial(config_value, c)
        heads, expand, hidden = int(get("mamba_n_heads", 128)), int(get("mamba_expand", 2)), int(c.get("hidden_size"))
        head_dim = get("mamba_d_head", "auto")
        head_dim = expand * hidden // heads if head_dim == "auto" else int(head_dim)
        return Mamba2Sizes(heads, head_dim, int(get("mamba_n_groups", 1)), int(get("mamba_d_state", 256)),
                           int(get("mamba_d_conv", 4)), int(get("mamba_chunk_size", 256)))

    @property
    def inner(self) -> int:
        return self.heads * self.head_dim

    @property
    def conv_dim(self) -> int:
        return self.inner + 2 * self.groups * self.state_size


def json_float(value: float | dict) -> float:
    """A float as config.json holds it: a number, or transformers >= 5's {"__float__": "Infinity"}."""
    return float(value["__float__"] if isinstance(value, dict) else value)


def segment_sum(x: torch.Tensor) -> torch.Tensor:
    """[..., L] -> [..., L, L]: entry (i, j) the sum of x over (j, i], -inf above the diagonal
    (transformers' cumsum-and-mask form, the stable one)."""
    size = x.shape[-1]
    x = x[..., None].expand(*x.shape, size)
    x = x.masked_fill(~torch.ones(size, size, dtype=torch.bool).tril(-1), 0)
    return x.cumsum(dim=-2).masked_fill(~torch.ones(size, size, dtype=torch.bool).tril(0), float("-inf"))


def chunk_scan(x: torch.Tensor, dt: torch.Tensor, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor,
               d: torch.Tensor, state: torch.Tensor, chunk_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """x [T, heads, P], dt [T, heads] (after bias, softplus, limit), a/d [heads], b/c [T, G, N], state
    [heads, P, N]; float32. Returns (y [T, heads, P] with D's skip, the final state)."""
    t, heads, _ = x.shape
    b, c = (m.repeat_interleave(heads // m.shape[1], dim=1) for m in (b, c))  # [T, heads, N]
    skip = d[:, None] * x
    pad = (chunk_size - t % chunk_size) % chunk_size
    x, a = x * dt[..., None], a * dt  # [T, heads, P], [T, heads]
    x, a, b, c = (_pad_rows(m, pad) for m in (x, a, b, c))
    x, b, c = (m.reshape(-1, chunk_size, *m.shape[1:]) for m in (x, b, c))  # [n, L, heads, *]
    a = a.reshape(-1, chunk_size, heads).permute(2, 0, 1)  # [heads, n, L]
    a_cumsum = a.cumsum(dim=-1)
    # within each chunk: attention-like scores C_l . B_s, decayed from s to l
    scores = torch.einsum("clhn,cshn->clsh", c, b) * segment_sum(a).exp().permute(1, 2, 3, 0)
    y_diag = torch.einsum("clsh,cshp->clhp", scores, x)
    # each chunk's own contribution to the state at its end
    decay_to_end = (a_cumsum[:, :, -1:] - a_cumsum).exp().permute(1, 2, 0)[..., None]  # [n, L, heads, 1]
    states = torch.einsum("clhn,clhp->chpn", b * decay_to_end, x)  # [n, heads, P, N]
    # the scan over chunks: the state at each chunk's start (the one before, then each chunk's)
    states = torch.cat([state[None].to(states.dtype), states])
    decay_chunk = segment_sum(F.pad(a_cumsum[:, :, -1], (1, 0))).exp()  # [heads, n + 1, n + 1]
    states = torch.einsum("hcz,zhpn->chpn", decay_chunk, states)
    states, final = states[:-1], states[-1]
    y_off = torch.einsum("clhn,chpn->clhp", c, states) * a_cumsum.exp().permute(1, 2, 0)[..., None]
    y = (y_diag + y_off).reshape(-1, heads, x.shape[-1])[:t]
    return y + skip, final


def _pad_rows(m: torch.Tensor, pad: int) -> torch.Tensor:
    """m with `pad` zero rows after its last (zero steps are inert: dt = 0 moves nothing)."""
    return torch.cat([m, m.new_zeros(pad, *m.shape[1:])]) if pad else m


def state_step(x: torch.Tensor, dt: torch.Tensor, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor,
               d: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
    """One token: x [heads, P], dt [heads] (after bias and softplus), b/c [G, N]; `state` [heads, P, N]
    moved on in place. Returns y [heads, P] with D's skip."""
    heads = x.shape[0]
    b, c = (m.repeat_interleave(heads // m.shape[0], dim=0) for m in (b, c))  # [heads, N]
    state.mul_((dt * a).exp()[:, None, None]).add_((dt[:, None, None] * b[:, None, :]) * x[..., None])
    return (state @ c[..., None])[..., 0] + x * d[:, None]


def gated_group_rms_norm(y: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, groups: int,
                         eps: float) -> torch.Tensor:
    """weight * rms_normalize(y * silu(gate)) over each of `groups` equal slices of the channels
    (the gate before the norm: norm_before_gate false); float32 inside."""
    t, channels = y.shape
    y = (y.float() * F.silu(gate.float())).view(t, groups, channels // groups)
    y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + eps)
    return weight.float() * y.view(t, channels)


class Mamba2Mixer:
    """The mixer of a "mamba" layer (`prefix`: its `mamba.` module: in_proj, conv1d, dt_bias, A_log,
    D, norm, out_proj). `time_step_limit` bounds dt in the chunked form only, as transformers does."""

    takes_device_position = True  # a decode call may be captured in a CUDA graph (base.Mixer)
    recurrent = True  # its state moves with every token and cannot be moved back (base.Mixer)
    chunks_prompt = True  # a long prompt may come in chunks, each continuing the state (base.Mixer)

    def __init__(self, config: ModelConfig, weights: ModelWeights, prefix: str, dtype: torch.dtype) -> None:
        if config.get("hidden_act", "silu") != "silu":
            raise UnsupportedFamilyError(f"a Mamba2 layer with hidden_act {config.get('hidden_act')!r}: ft runs silu")
        self.sizes = Mamba2Sizes.of(config)
        self.in_proj, self.in_bias = weights.get(prefix + "in_proj.weight"), weights.maybe(prefix + "in_proj.bias")
        self.out_proj, self.out_bias = weights.get(prefix + "out_proj.weight"), weights.maybe(prefix + "out_proj.bias")
        conv = weights.get(prefix + "conv1d.weight")  # [C, 1, K] as nn.Conv1d stores a depthwise kernel
        self.conv, self.conv_bias = conv.reshape(conv.shape[0], conv.shape[-1]), weights.maybe(prefix + "conv1d.bias")
        self.a_log, self.d, self.dt_bias = (weights.get(prefix + name) for name in ("A_log", "D", "dt_bias"))
        self.norm = weights.get(prefix + "norm.weight")
        low, high = config.get("time_step_limit") or (0.0, float("inf"))
        self.dt_limit = (json_float(low), json_float(high))
        self.eps, self.dtype = config.rms_norm_eps, dtype

    def new_cache(self, max_tokens: int) -> Mamba2State:
        s = self.sizes
        return Mamba2State(torch.zeros(s.conv_dim, s.kernel - 1, dtype=self.dtype),
                           torch.zeros(s.heads, s.head_dim, s.state_size, dtype=torch.float32))

    def __call__(self, x: torch.Tensor, positions: torch.Tensor, cache: Mamba2State, start: Start) -> torch.Tensor:
        """A prompt (T > 1) by the chunked form from the state, a token by one step; the state updated
        in place, so a CUDA graph captured over it stays valid; at a DevicePosition its host `length`
        is left to the caller."""
        cache.seek(start)
        s, t = self.sizes, x.shape[0]
        gate, xbc, dt = linear(x, self.in_proj, self.in_bias).split([s.inner, s.conv_dim, s.heads], dim=-1)
        xbc, conv = causal_conv1d(xbc, cache.conv, self.conv, self.conv_bias)
        cache.conv.copy_(conv)
        h, b, c = xbc.float().split([s.inner, s.groups * s.state_size, s.groups * s.state_size], dim=-1)
        h, b, c = h.view(t, s.heads, s.head_dim), b.view(t, s.groups, s.state_size), c.view(t, s.groups, s.state_size)
        dt = F.softplus(dt.float() + self.dt_bias.float())  # [T, heads]
        a, d = -self.a_log.float().exp(), self.d.float()
        if t == 1:
            y = state_step(h[0], dt[0], a, b[0], c[0], d, cache.recurrent)[None]
        else:
            y, final = chunk_scan(h, dt.clamp(*self.dt_limit), a, b, c, d, cache.recurrent, s.chunk_size)
            cache.recurrent.copy_(final)
        if not isinstance(start, DevicePosition):
            cache.length = start + t
        y = gated_group_rms_norm(y.reshape(t, s.inner), gate, self.norm, s.groups, self.eps)
        return linear(y.to(x.dtype), self.out_proj, self.out_bias)
