"""Manifold-constrained hyper-connections (mHC, DeepSeek-V4), as transformers' DeepseekV4HyperConnection
and DeepseekV4HyperHead compute them.

The residual is `n` parallel streams, x [T, n, H]. Around each sublayer (attention, FFN), a small
projection of all streams gives three mixes: `pre` [T, n] collapses the streams into the sublayer's
input, `post` [T, n] spreads its output back over them, and `comb` [T, n, n] (doubly stochastic
after Sinkhorn-Knopp iterations) mixes the streams themselves:
x' = post * out + comb^T x. The embeddings enter as n copies; before the final norm the head
collapses the streams once more with a `pre` of its own. Every mix is computed in float32.

Tencent Hy4's independent hyper-connections (iHC, transformers' HYV4HyperConnection) are this
without `comb`: two mixes, `post` scaled by a magnitude of the config's, and the streams carried
over as they are, x' = post * out + x (`IndependentHyperConnection`); its head is `HyperHead`.

Qwen4-Exp's gated residual (transformers' Qwen4ExpTextGatedResidual) reads the streams through
a zero-centred RMSNorm of each stream (`GatedHyperConnection`): the sublayer's input is the mean
over the streams of the normed streams times sigmoid(up(silu(down(normed) / n))), a gate for
every channel of every stream through a low-rank bottleneck; its output joins each stream times
2 sigmoid(inject(normed) / n), x' = x + inject * out. Its head (`GatedHyperHead`) is the same
mix without the injection, in the model's dtype throughout.

`HyperConnection`, `IndependentHyperConnection` and `GatedHyperConnection` are base.Residual
(enter, leave) and `HyperHead` and `GatedHyperHead` base.Streams (expand, collapse): DecoderModel
runs them where a block and the model have them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .norm import unweighted_rms_norm


@dataclass(frozen=True)
class HyperConnection:
    """One sublayer's mHC: `fn` [(2 + n) n, n H], `base` [(2 + n) n], `scale` [3] (pre, post, comb),
    as checkpoints name them (attn_hc.fn, ...); `eps` is hc_eps, `norm_eps` the input norm's."""

    fn: torch.Tensor
    base: torch.Tensor
    scale: torch.Tensor
    streams: int
    sinkhorn_iters: int
    eps: float
    norm_eps: float

    def enter(self, x: torch.Tensor) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """x [T, n, H] -> (the sublayer's input [T, H] in x's dtype, (post [T, n], comb [T, n, n]))."""
        n = self.streams
        flat = unweighted_rms_norm(x.reshape(x.shape[0], -1).float(), self.norm_eps)
        mixes = F.linear(flat, self.fn.float())  # [T, (2 + n) n]
        pre_w, post_w, comb_w = mixes.split([n, n, n * n], dim=-1)
        pre_b, post_b, comb_b = self.base.float().split([n, n, n * n])
        pre_s, post_s, comb_s = self.scale.float().unbind(0)
        pre = torch.sigmoid(pre_w * pre_s + pre_b) + self.eps
        post = 2 * torch.sigmoid(post_w * post_s + post_b)
        comb = torch.softmax(comb_w.view(-1, n, n) * comb_s + comb_b.view(n, n), dim=-1) + self.eps
        comb = comb / (comb.sum(dim=-2, keepdim=True) + self.eps)
        for _ in range(self.sinkhorn_iters - 1):  # rows and columns to sum 1 (Sinkhorn-Knopp)
            comb = comb / (comb.sum(dim=-1, keepdim=True) + self.eps)
            comb = comb / (comb.sum(dim=-2, keepdim=True) + self.eps)
        collapsed = (pre.unsqueeze(-1) * x).sum(dim=1).to(x.dtype)
        return collapsed, (post, comb)

    def leave(self, x: torch.Tensor, out: torch.Tensor, mixes: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """The streams after the sublayer: post * out + comb^T x -> [T, n, H] (comb is read by its
        first index, sum_j comb[j, k] x[j], as transformers does: it is not symmetric)."""
        post, comb = mixes
        return post.to(x.dtype).unsqueeze(-1) * out.unsqueeze(-2) + torch.matmul(comb.to(x.dtype).transpose(-1, -2), x)


@dataclass(frozen=True)
class IndependentHyperConnection:
    """One sublayer's iHC (Hy4): `fn` [2n, n H], `base` [2n], `scale` [2] (pre, post), as transformers
    names them (attn_hc.fn, ...); `magnitude` is hc_magnitude, `eps` hc_eps, `norm_eps` the input
    norm's. pre = sigmoid(.) + eps, post = magnitude * sigmoid(.) + eps; no stream mixing."""

    fn: torch.Tensor
    base: torch.Tensor
    scale: torch.Tensor
    streams: int
    magnitude: float
    eps: float
    norm_eps: float

    def enter(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [T, n, H] -> (the sublayer's input [T, H] in x's dtype, post [T, n] float32)."""
        n = self.streams
        flat = x.reshape(x.shape[0], -1).float()
        # (as transformers: the projection of the raw streams times their inverse rms)
        mixes = F.linear(flat, self.fn.float()) * torch.rsqrt(flat.square().mean(-1, keepdim=True) + self.norm_eps)
        pre_w, post_w = mixes.split([n, n], dim=-1)
        pre_b, post_b = self.base.float().split([n, n])
        pre_s, post_s = self.scale.float().unbind(0)
        pre = torch.sigmoid(pre_w * pre_s + pre_b) + self.eps
        post = self.magnitude * torch.sigmoid(post_w * post_s + post_b) + self.eps
        return (pre.unsqueeze(-1) * x).sum(dim=1).to(x.dtype), post

    def leave(self, x: torch.Tensor, out: torch.Tensor, post: torch.Tensor) -> torch.Tensor:
        """The streams after the sublayer: post * out + x, in float32 and cast back -> [T, n, H]."""
        return (post.unsqueeze(-1) * out.float().unsqueeze(-2) + x.float()).to(x.dtype)


@dataclass(frozen=True)
class HyperHead:
    """The streams of a model with mHC: the embeddings copied into `streams` of them, and the last
    layer's collapsed by `fn` [n, n H], `base` [n], `scale` [1] (hc_head.hc_fn, ...)."""

    fn: torch.Tensor
    base: torch.Tensor
    scale: torch.Tensor
    streams: int
    eps: float
    norm_eps: float

    def expand(self, x: torch.Tensor) -> torch.Tensor:
        """[T, H] -> [T, n, H]."""
        return x.unsqueeze(1).expand(-1, self.streams, -1).contiguous()

    def collapse(self, x: torch.Tensor) -> torch.Tensor:
        """[T, n, H] -> [T, H], in x's dtype."""
        flat = unweighted_rms_norm(x.reshape(x.shape[0], -1).float(), self.norm_eps)
        pre = torch.sigmoid(F.linear(flat, self.fn.float()) * self.scale.float() + self.base.float()) + self.eps
        return (pre.unsqueeze(-1) * x).sum(dim=1).to(x.dtype)


@dataclass(frozen=True)
class GatedHyperConnection:
    """One sublayer's gated residual (Qwen4-Exp): `norm` [n H] (hc_norm, zero-centred, each stream
    normed alone), `down` [r, n H] and `up` [n H, r] (input_mix_weight_down/up), `inject` [n, n H]
    (block_inject_weight; None in the head's mixer)."""

    norm: torch.Tensor
    down: torch.Tensor
    up: torch.Tensor
    inject: torch.Tensor | None
    streams: int
    norm_eps: float

    def mix(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [T, n, H] -> (the mixed input [T, H], the normed streams flattened [T, n H])."""
        n, size = self.streams, x.shape[-1]
        h = x.float()  # (each stream alone; a [n, H] weight, which the device's norm kernel does not take)
        h = h * torch.rsqrt(h.square().mean(-1, keepdim=True) + self.norm_eps) * (1.0 + self.norm.float().view(n, size))
        normed = h.to(x.dtype).reshape(x.shape[0], n * size)
        gates = torch.sigmoid(F.linear(F.silu(F.linear(normed, self.down) / n), self.up))  # [T, n H]
        return (gates * normed).view(x.shape).mean(dim=-2), normed

    def enter(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [T, n, H] -> (the sublayer's input [T, H], the injection weights [T, n])."""
        assert self.inject is not None, "the head's mixer joins no sublayer"
        mixed, normed = self.mix(x)
        return mixed, 2 * torch.sigmoid(F.linear(normed, self.inject) / self.streams)

    def leave(self, x: torch.Tensor, out: torch.Tensor, inject: torch.Tensor) -> torch.Tensor:
        """The streams after the sublayer: x + inject * out -> [T, n, H]."""
        return x + out.unsqueeze(-2) * inject.unsqueeze(-1)


@dataclass(frozen=True)
class GatedHyperHead:
    """The streams of a model with gated residuals: the embeddings copied into `mixer.streams` of
    them, and the last layer's mixed by `mixer` (hyper_connection_mixer, no injection)."""

    mixer: GatedHyperConnection

    def expand(self, x: torch.Tensor) -> torch.Tensor:
        """[T, H] -> [T, n, H]."""
        return x.unsqueeze(1).expand(-1, self.mixer.streams, -1).contiguous()

    def collapse(self, x: torch.Tensor) -> torch.Tensor:
        """[T, n, H] -> [T, H]."""
        return self.mixer.mix(x)[0]
