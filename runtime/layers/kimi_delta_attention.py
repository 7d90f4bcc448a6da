"""Kimi Delta Attention (KDA): Gated DeltaNet (gated_deltanet.py) whose decay is per key channel,
not per head, the linear-attention mixer of Kimi Linear (and Ling's bailing_hybrid).

q, k and v come from their own projections through one short causal depthwise conv (SiLU); the
log decay g [T, heads, Dk] from a forget gate (each family's), the write strength beta from
sigmoid(b_proj x). Each head's state S [Dk, Dv] moves per token as

    S = exp(g)[:, None] * S;  S += k (beta * (v - k S))^T;  out = q S

(q and k L2-normalized, q scaled by 1/sqrt(Dk)). A prompt runs the chunked form (64-token chunks,
the UT transform solved per chunk), a decode step the rule itself, both as transformers' torch
fallbacks (`chunk_kimi_delta_attention`, `recurrent_kimi_delta_attention`) compute them, in
float32; the chunked one here takes a chunk at a time, so what it holds does not grow with the
prompt (transformers' keeps [heads, chunks, 64, 64, Dk] of decays). The output is RMS-normed per
head and gated by sigmoid of the output gate, then o_proj.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..loading.read_ftw import ModelWeights
from .attention import DevicePosition, Start
from .gated_deltanet import DeltaNetState, causal_conv1d
from .linear import linear

CHUNK_SIZE = 64
# x [T, H] -> log decay g [T, heads, Dk], in the dtype the family's gate returns it (Kimi's float32)
Gate = Callable[[torch.Tensor], torch.Tensor]


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    # x / sqrt(sum + eps), as FLA's KDA kernels (and transformers' fallback) take it
    return x / torch.sqrt((x * x).sum(dim=-1, keepdim=True) + eps)


def chunk_kda(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
              state: torch.Tensor, chunk_size: int = CHUNK_SIZE) -> tuple[torch.Tensor, torch.Tensor]:
    """q/k [H, T, Dk] (normalized, q scaled), v [H, T, Dv], g [H, T, Dk], beta [H, T], state [H, Dk, Dv];
    all float32. Returns (out [H, T, Dv], final state)."""
    t = k.shape[1]
    out = torch.empty_like(v)
    for first in range(0, t, chunk_size):  # (a short last chunk is the padded one's first rows)
        end = min(first + chunk_size, t)
        c = end - first
        qc, kc, vc = q[:, first:end], k[:, first:end], v[:, first:end]
        k_beta, v_beta = kc * beta[:, first:end, None], vc * beta[:, first:end, None]
        decay = g[:, first:end].cumsum(dim=1)  # [H, C, Dk]: log decay from the chunk start
        upper = torch.ones(c, c, dtype=torch.bool, device=k.device).triu(1)
        pairwise = (decay[:, :, None, :] - decay[:, None, :, :]).masked_fill(upper[..., None], float("-inf")).exp()
        # UT transform: solve (I + strictly-lower(sum_d beta k_i k_j decay)) X = v_beta, and = k_beta decay
        system = (k_beta[:, :, None, :] * kc[:, None, :, :] * pairwise).sum(dim=-1).tril(-1)
        system = system + torch.eye(c, device=k.device)
        new_values = torch.linalg.solve_triangular(system, v_beta, upper=False, unitriangular=True)
        k_cumdecay = torch.linalg.solve_triangular(system, k_beta * decay.exp(), upper=False, unitriangular=True)
        intra = (qc[:, :, None, :] * kc[:, None, :, :] * pairwise).sum(dim=-1).masked_fill(upper, 0.0)  # [H, C, C]
        v_new = new_values - k_cumdecay @ state
        out[:, first:end] = (qc * decay.exp()) @ state + intra @ v_new
        last = decay[:, -1:]  # [H, 1, Dk]
        state = state * last.exp().transpose(1, 2) + (kc * (last - decay).exp()).transpose(1, 2) @ v_new
    return out, state


def recurrent_kda(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                  state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The same rule token by token (decode), `state` updated in place; shapes as `chunk_kda`."""
    out = torch.empty_like(v)
    for i in range(k.shape[1]):
        q_t, k_t, v_t = q[:, i], k[:, i], v[:, i]  # [H, D]
        state.mul_(g[:, i].exp()[..., None])
        memory = (state * k_t[..., None]).sum(dim=-2)  # [H, Dv]: what the state predicts for k_t
        delta = (v_t - memory) * beta[:, i, None]
        state.add_(k_t[..., None] * delta[:, None, :])
        out[:, i] = (state * q_t[..., None]).sum(dim=-2)
    return out, state


def gated_rms_norm(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """weight * normalize(x) * sigmoid(gate), all in float32 (KimiLinearRMSNormGated), then x's dtype."""
    h = x.to(torch.float32)
    h = weight.to(torch.float32) * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps))
    return (h * torch.sigmoid(gate.to(torch.float32))).to(x.dtype)


class KimiDeltaAttention:
    """The mixer of a KDA layer: q/k/v projections and conv (`conv1d`, or the release's
    q_conv1d, k_conv1d and v_conv1d), the family's forget gate `gate`, b_proj, the output gate
    `output_gate` (x -> [T, heads * Dv]), o_norm and o_proj."""

    takes_device_position = True  # a decode call may be captured in a CUDA graph (base.Mixer)
    recurrent = True  # its state moves with every token and cannot be moved back (base.Mixer)
    chunks_prompt = True  # a long prompt may come in chunks, each continuing the state (base.Mixer)

    def __init__(self, weights: ModelWeights, prefix: str, *, heads: int, head_dim: int, gate: Gate,
                 output_gate: Callable[[torch.Tensor], torch.Tensor], eps: float, dtype: torch.dtype) -> None:
        self.q, self.k, self.v = (weights.get(f"{prefix}{p}_proj.weight") for p in "qkv")
        conv = weights.maybe(prefix + "conv1d.weight")
        if conv is None:  # (transformers concatenates the release's three at load; so does this, once)
            conv = torch.cat([weights.get(f"{prefix}{p}_conv1d.weight") for p in "qkv"])
        self.conv = conv.reshape(conv.shape[0], conv.shape[-1])  # [3 * heads * D, K]
        self.b, self.o_norm, self.o = (weights.get(prefix + n) for n in ("b_proj.weight", "o_norm.weight", "o_proj.weight"))
        self.heads, self.head_dim, self.gate, self.output_gate = heads, head_dim, gate, output_gate
        self.eps, self.dtype = eps, dtype

    def new_cache(self, max_tokens: int) -> DeltaNetState:
        channels, width = self.conv.shape
        return DeltaNetState(torch.zeros(channels, width - 1, dtype=self.dtype),
                             torch.zeros(self.heads, self.head_dim, self.head_dim, dtype=torch.float32))

    def __call__(self, x: torch.Tensor, positions: torch.Tensor, cache: DeltaNetState, start: Start) -> torch.Tensor:
        cache.seek(start)
        t, size = x.shape[0], self.heads * self.head_dim
        qkv = torch.cat((linear(x, self.q), linear(x, self.k), linear(x, self.v)), dim=-1)
        qkv, conv = causal_conv1d(qkv, cache.conv, self.conv, None)
        cache.conv.copy_(conv)
        q, k, v = (part.reshape(t, self.heads, self.head_dim).transpose(0, 1).to(torch.float32)
                   for part in qkv.split([size, size, size], dim=-1))  # [H, T, D]
        g = self.gate(x).transpose(0, 1).to(torch.float32)  # [H, T, Dk]
        beta = torch.sigmoid(linear(x, self.b)).transpose(0, 1).to(torch.float32)  # [H, T]
        q, k = l2norm(q), l2norm(k)
        # transformers decodes token by token only after a prompt (its cache holds a state), else chunks
        if isinstance(start, DevicePosition) or (t == 1 and start > 0):
            out, _ = recurrent_kda(q * q.shape[-1] ** -0.5, k, v, g, beta, cache.recurrent)
        else:
            out, final = chunk_kda(q * q.shape[-1] ** -0.5, k, v, g, beta, cache.recurrent)
            cache.recurrent.copy_(final)
        if not isinstance(start, DevicePosition):
            cache.length = start + t
        out = out.transpose(0, 1).to(x.dtype)  # [T, H, D]
        gate = self.output_gate(x).view(t, self.heads, self.head_dim)
        return linear(gated_rms_norm(out, gate, self.o_norm, self.eps).reshape(t, size), self.o)


def softplus_decay(a_log: torch.Tensor, gate_input: torch.Tensor) -> torch.Tensor:
    """-exp(A_log) * softplus(gate_input), the softplus as log(1 + exp) below 20 and the identity
    above (Kimi Linear's forget gate, FLA's form), float32. a_log broadcasts over [T, heads, Dk]."""
    softplus = torch.where(gate_input > 20.0, gate_input, torch.log(1.0 + torch.exp(gate_input)))
    return -torch.exp(a_log.float()) * softplus

