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
    t, length = q.shape[0], k.shape[0]
    qh, kh, vh = q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1)  # [heads, T|L, D]
    if t == 1:
        mask = None  # the one new token sees everything before it
    else:
        query_pos = torch.arange(start, start + t)[:, None]
        mask = torch.arange(length)[None, :] <= query_pos  # [T, L]
    out = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, scale=scale,
                                         enable_gqa=qh.shape[0] != kh.shape[0])
    return out.transpose(0, 1)
