"""Causal attention with an additive bias a cached key (Doge's dynamic mask attention), over a KV
cache that keeps the bias beside each key.

Each key carries one bias a key head, which every query of that head adds to its score (after the
scale), and where a query sees more than `keep` keys, only the `keep` of largest bias stay: the
others are masked (transformers' DogeAttention.prepare_dynamic_mask, its `keep_window_size`:
a top-k over the key axis of the bias, the keys a query cannot see being at the dtype's minimum,
so they are never kept ahead of one it sees). Of keys of equal bias at the `keep`-th place the
later ones stay: transformers' torch.topk keeps some of them, which ones depending on the row's
length and layout (its prompt pass and its one-token steps choose differently), and a rule of the
keys alone keeps a prompt's logits those of its tokens decoded one by one. Equal biases are no
rarity: a key's bias is its value's, and on the first layer a token's value is its embedding's, so
a repeated token repeats it. SDPA takes an additive mask, but the
top-k is a query's own, so the scores are explicit here, as layers/sink_attention.py keeps them:
float32 softmax, queries in blocks whose scores stay within MASKED_SCORES_PER_CALL, each block
reading only the keys its queries can see.
"""

from __future__ import annotations

import torch

from .attention import DevicePosition, KVCache, Start, query_blocks, store


class KeyBiasCache(KVCache):
    """Keys and values [max_tokens, kv_heads, dim] and each key's bias [max_tokens, kv_heads]."""

    def __init__(self, max_tokens: int, kv_heads: int, k_dim: int, v_dim: int, dtype: torch.dtype) -> None:
        super().__init__(max_tokens, kv_heads, k_dim, v_dim, dtype)
        self.bias = torch.zeros(max_tokens, kv_heads, dtype=dtype)

    def append_biased(self, start: Start, k: torch.Tensor, v: torch.Tensor,
                      bias: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Store k/v [T, Hkv, D] and bias [T, Hkv] from `start`; returns all cached up to there (a
        DevicePosition: its span, the positions after it masked by the attention)."""
        keys, values = self.append(start, k, v)
        return keys, values, store(self.bias, start, bias)


def key_bias_causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor, start: Start,
                              scale: float, *, window: int | None = None, keep: int | None = None) -> torch.Tensor:
    """q [T, Hq, D] at positions [start, start + T); k/v [L, Hkv, D] and bias [L, Hkv] for positions
    [0, L), as the cache returns them. -> [T, Hq, Dv]. `window`: a query at p sees the keys from
    p - window + 1 to p, else all up to p; `keep`: of those, the `keep` of largest bias (None: all).
    With a DevicePosition (one token), the keys after its index, and before its window, are masked
    on the device."""
    if isinstance(start, DevicePosition):
        return _attend(q, k, v, bias, start.index, 0, scale, window, keep)
    parts = []
    for first, last, first_key in query_blocks(start, q.shape[0], q.shape[1], window):
        positions = torch.arange(first, last, device=q.device)
        parts.append(_attend(q[first - start:last - start], k[first_key:last], v[first_key:last], bias[first_key:last],
                             positions, first_key, scale, window, keep))
    return parts[0] if len(parts) == 1 else torch.cat(parts)


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor, positions: torch.Tensor,
            first_key: int, scale: float, window: int | None, keep: int | None) -> torch.Tensor:
    """Queries q [C, Hq, D] at `positions` [C] over keys k/v [K, Hkv, D] with bias [K, Hkv] at
    positions from `first_key`: the keys after a query's position, before its window, or past its
    `keep` largest biases, masked."""
    c, heads, dim = q.shape
    kv_heads = k.shape[1]
    group = heads // kv_heads
    qg = q.reshape(c, kv_heads, group, dim).permute(1, 2, 0, 3)  # [Hkv, G, C, D]: query head h = kv head h // G
    scores = torch.matmul(qg, k.permute(1, 2, 0)[:, None]) * scale  # [Hkv, G, C, K], in q's dtype as transformers
    scores = scores + bias.t()[:, None, None, :]  # (the bias in the compute dtype too, added after the scale)
    keys = torch.arange(first_key, first_key + k.shape[0], device=q.device)[None, :]
    hidden = keys > positions[:, None]  # [C, K]
    if window is not None:
        hidden |= keys <= positions[:, None] - window
    hidden = hidden[None, None]  # [1, 1, C, K]
    if keep is not None and k.shape[0] > keep:  # (fewer keys than `keep`: every one a query sees stays)
        seen = bias.t().to(torch.float32)[:, None, :].masked_fill(hidden[0], float("-inf"))  # [Hkv, C, K]
        # the `keep` largest, equal ones the later first: a stable sort of the keys taken last to first
        order = torch.sort(seen.flip(-1), dim=-1, descending=True, stable=True).indices[..., :keep]
        kept = torch.zeros_like(seen, dtype=torch.bool).scatter_(-1, k.shape[0] - 1 - order, True)
        hidden = hidden | ~kept[:, None]  # [Hkv, 1, C, K] (a query seeing fewer: masked ones "kept" stay masked)
    probs = torch.softmax(scores.to(torch.float32).masked_fill(hidden, float("-inf")), dim=-1).to(v.dtype)
    out = torch.matmul(probs, v.permute(1, 0, 2)[:, None])  # [Hkv, G, C, Dv]
    return out.permute(2, 0, 1, 3).reshape(c, heads, v.shape[-1])
