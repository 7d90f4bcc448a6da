"""Compressed convolutional attention (ZAYA's CCA, arXiv 2510.04476), over a KV cache that keeps
each token's convolution inputs beside its key and value.

Queries and keys come from q_proj and k_proj run through two causal convolutions over the
sequence: a depthwise one (`cca_time0` taps) and one grouped by head (`cca_time1` taps, each
head's channels mixed), both with biases, over the raw projections of this token and the
(cca_time0 - 1) + (cca_time1 - 1) before it, zeros before the first (transformers'
ZayaCCAProjection pads them so, the depthwise bias then reaching the grouped one's first taps).
Each gets a residual path: r = (q + k of its key head) / 2 per query head, the queries' r as
it is, the keys' r averaged over the query heads sharing them. The values' first half is
`v_proj_current` of this token, the second `v_proj_delayed` of the token before (of a zero
input before the first: its bias). Queries and keys are then L2-normed to sqrt(head_dim), keys
times a learned scale a key head (`qk_norm.temp`), rotated (RoPE on a head's first channels),
and attend causally or within a sliding window.

The convolution's inputs and the delayed values are cached a row a position beside the keys and
values (CCACache), not as a window every token moves on: a state is read by position, so it
rewinds, is copied as a prompt prefix and parked as attention's keys are (models/state_copy.py),
and a long prompt may come in chunks. That costs (heads + kv_heads) x head_dim + kv_heads x
head_dim / 2 values a token beside the 2 x kv_heads x head_dim of keys and values.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..loading.read_ftw import ModelWeights
from .attention import DevicePosition, KVCache, Start, causal_attention, sliding_causal_attention, store
from .linear import linear
from .rope import RotaryEmbedding, apply_rotary


class CCACache(KVCache):
    """Keys and values [max_tokens, kv_heads, head_dim], each token's q/k projections [max_tokens,
    (heads + kv_heads) x head_dim] (the convolutions' inputs) and its delayed values [max_tokens,
    kv_heads x head_dim / 2] (v_proj_delayed's output, which the next token's values read)."""

    def __init__(self, max_tokens: int, heads: int, kv_heads: int, head_dim: int, dtype: torch.dtype) -> None:
        super().__init__(max_tokens, kv_heads, head_dim, head_dim, dtype)
        self.qk = torch.zeros(max_tokens, (heads + kv_heads) * head_dim, dtype=dtype)
        self.delayed = torch.zeros(max_tokens, kv_heads * head_dim // 2, dtype=dtype)


def rows_before(rows: torch.Tensor, start: Start, count: int, before_first: torch.Tensor | None = None) -> torch.Tensor:
    """The `count` rows of `rows` [max_tokens, C] at positions [start - count, start), those before
    position 0 `before_first` [C] (None: zeros). A DevicePosition's are gathered on the device."""
    fill = torch.zeros(rows.shape[1], dtype=rows.dtype, device=rows.device) if before_first is None else before_first
    if isinstance(start, DevicePosition):
        index = start.index + torch.arange(-count, 0, device=rows.device)  # [count]
        gathered = rows.index_select(0, index.clamp(min=0))
        return torch.where((index >= 0)[:, None], gathered, fill.to(rows.dtype))
    if start >= count:
        return rows[start - count:start]
    return torch.cat((fill.to(rows.dtype).expand(count - start, -1), rows[:start]))


class CCAttention:
    """The mixer of a CCA layer (`prefix`: its `self_attn.`: qkv_proj.{q_proj, k_proj,
    v_proj_current, v_proj_delayed, conv_qk_depthwise, conv_qk_grouped}, qk_norm.temp, o_proj).
    `window`: attention within that many positions (None: all)."""

    takes_device_position = True  # a decode call may be captured in a CUDA graph (base.Mixer)
    chunks_prompt = True  # a later chunk reads the earlier ones' rows from the cache (base.Mixer)

    def __init__(self, weights: ModelWeights, prefix: str, rope: RotaryEmbedding, dtype: torch.dtype, *,
                 heads: int, kv_heads: int, head_dim: int, window: int | None) -> None:
        p = prefix + "qkv_proj."
        names = ("q_proj", "k_proj", "v_proj_current", "v_proj_delayed")
        self.q, self.k, self.v_current, self.v_delayed = (weights.get(f"{p}{n}.weight") for n in names)
        self.q_bias, self.k_bias, self.v_current_bias, self.v_delayed_bias = (weights.maybe(f"{p}{n}.bias")
                                                                                for n in names)
        self.depthwise, self.depthwise_bias = weights.get(p + "conv_qk_depthwise.weight"), weights.maybe(
            p + "conv_qk_depthwise.bias")  # [C, 1, time0]
        self.grouped, self.grouped_bias = weights.get(p + "conv_qk_grouped.weight"), weights.maybe(
            p + "conv_qk_grouped.bias")  # [C, head_dim, time1]
        self.context = (self.depthwise.shape[-1] - 1) + (self.grouped.shape[-1] - 1)  # earlier tokens a token reads
        self.temp = weights.get(prefix + "qk_norm.temp")  # [Hkv]
        self.o, self.o_bias = weights.get(prefix + "o_proj.weight"), weights.maybe(prefix + "o_proj.bias")
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.rope, self.dtype, self.window, self.scale = rope, dtype, window, head_dim ** -0.5

    def new_cache(self, max_tokens: int) -> CCACache:
        return CCACache(max_tokens, self.heads, self.kv_heads, self.head_dim, self.dtype)

    def __call__(self, x: torch.Tensor, positions: torch.Tensor, cache: CCACache, start: Start) -> torch.Tensor:
        q, k, v = self.project(x, cache, start)
        q, k = self.l2_norm(q), self.l2_norm(k) * self.temp[None, :, None]
        cos, sin = self.rope(positions, x.dtype)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        keys, values = cache.append(start, k, v)
        if self.window is None:
            out = causal_attention(q, keys, values, start, self.scale)
        else:
            out = sliding_causal_attention(q, keys, values, start, self.scale, self.window)
        return linear(out.reshape(x.shape[0], self.heads * self.head_dim), self.o, self.o_bias)

    def project(self, x: torch.Tensor, cache: CCACache, start: Start) -> tuple[torch.Tensor, ...]:
        """q [T, Hq, D], k and v [T, Hkv, D] of x [T, H], its convolution inputs and delayed
        values stored in `cache` from `start`."""
        t, d, group = x.shape[0], self.head_dim, self.heads // self.kv_heads
        q, k = linear(x, self.q, self.q_bias), linear(x, self.k, self.k_bias)  # [T, Hq x D], [T, Hkv x D]
        qk = torch.cat((q, k), dim=-1)  # [T, C]
        earlier = rows_before(cache.qk, start, self.context)  # [context, C]
        store(cache.qk, start, qk)
        mixed = F.conv1d(torch.cat((earlier, qk)).t()[None], self.depthwise, self.depthwise_bias,
                         groups=qk.shape[1])  # [1, C, T + time1 - 1]
        mixed = F.conv1d(mixed, self.grouped, self.grouped_bias, groups=self.heads + self.kv_heads)[0].t()  # [T, C]
        residual = (q.view(t, self.heads, d) + k.view(t, self.kv_heads, d).repeat_interleave(group, dim=1)) * 0.5
        key_residual = residual.view(t, self.kv_heads, group, d).mean(dim=-2)  # [T, Hkv, D]
        split = self.heads * d
        query = mixed[:, :split].view(t, self.heads, d) + residual
        key = mixed[:, split:].view(t, self.kv_heads, d) + key_residual
        delayed = linear(x, self.v_delayed, self.v_delayed_bias)  # [T, Hkv x D / 2]
        previous = rows_before(cache.delayed, start, 1, self.v_delayed_bias)  # (before the first: a zero input's)
        store(cache.delayed, start, delayed)
        current = linear(x, self.v_current, self.v_current_bias)
        value = torch.cat((current, torch.cat((previous, delayed[:-1]))), dim=-1)  # [T, Hkv x D]
        return query, key, value.view(t, self.kv_heads, d)

    def l2_norm(self, x: torch.Tensor) -> torch.Tensor:
        """x [T, heads, D] scaled to length sqrt(D) a head (transformers' ZayaQKNorm, in x's dtype)."""
        eps = torch.finfo(x.dtype).eps
        return x * (self.head_dim ** 0.5 / x.norm(p=2, dim=-1, keepdim=True).clamp_min(eps))
