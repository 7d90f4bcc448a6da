"""Causal attention over a preallocated KV cache (one sequence), shared by the GQA families."""

from __future__ import annotations

import torch
import torch.nn.functional as F


class KVCache:
    """Keys and values of one attention layer: [max_tokens, kv_heads, head_dim] each."""

    def __init__(self, max_tokens: int, kv_heads: int, k_dim: int, v_dim: int, dtype: torch.dtype) -> None:
        self.k = torch.zeros(max_tokens, kv_heads, k_dim, dtype=dtype)
        self.v = torch.zeros(max_tokens, kv_heads, v_dim, dtype=dtype)

    def append(self, start: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store k/v for positions [start, start + T); returns all keys/values up to there."""
        end = start + k.shape[0]
        self.k[start:end] = k
        self.v[start:end] = v
        return self.k[:end], self.v[:end]


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int, scale: float) -> torch.Tensor:
    """q [T, Hq, D] at positions [start, start+T); k/v [L, Hkv, D] for positions [0, L). -> [T, Hq, Dv]."""
    t, heads = q.shape[0], q.shape[1]
    kv_heads = k.shape[1]
    if t == 1:
        return _decode_attention(q, k, v, scale)
    group = heads // kv_heads
    qh = q.transpose(0, 1)  # [Hq, T, D]
    kh = k.transpose(0, 1).repeat_interleave(group, dim=0)  # [Hq, L, D], contiguous: the fast SDPA path
    vh = v.transpose(0, 1).repeat_interleave(group, dim=0)
    query_pos = torch.arange(start, start + t)[:, None]
    mask = torch.arange(k.shape[0])[None, :] <= query_pos  # [T, L]
    out = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, scale=scale)
    return out.transpose(0, 1)


def _decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """One query token over all cached keys: grouped matmuls, softmax in float32 (no mask needed)."""
    heads, kv_heads, dim = q.shape[1], k.shape[1], q.shape[2]
    qg = q[0].view(kv_heads, heads // kv_heads, dim)  # [Hkv, G, D]
    scores = torch.matmul(qg, k.permute(1, 2, 0)).to(torch.float32) * scale  # [Hkv, G, L]
    probs = torch.softmax(scores, dim=-1).to(v.dtype)
    out = torch.matmul(probs, v.transpose(0, 1))  # [Hkv, G, Dv]
    return out.reshape(1, heads, v.shape[-1])
