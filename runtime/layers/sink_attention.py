"""Causal attention with a learned sink logit per head (gpt-oss), over the shared KV cache.

Each query's softmax runs over the scores of the keys it sees and one more logit, its head's
sink, whose column is then dropped: the weights of the keys sum to less than one, the rest
"attends" to nothing (transformers' GptOss `eager_attention_forward`). SDPA has no such term,
and its CPU flash kernel returns no log-sum-exp to fold one in afterwards, so the scores are
explicit here: float32 softmax, queries in blocks whose scores stay within
MASKED_SCORES_PER_CALL, each block reading only the keys its queries can see (a sliding layer's
window), so nothing grows with the keys before them.
"""

from __future__ import annotations

import torch

from .attention import MASKED_SCORES_PER_CALL, DevicePosition, Start, query_blocks


def sink_causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: Start, scale: float,
                          sinks: torch.Tensor, window: int | None = None) -> torch.Tensor:
    """q [T, Hq, D] at positions [start, start + T); k/v [L, Hkv, D] for positions [0, L), as the
    cache returns them; sinks [Hq]. -> [T, Hq, Dv]. `window`: a query at p sees the keys from
    p - window + 1 to p (transformers' `sliding_window`), else all up to p. With a DevicePosition
    (one token), the keys after its index, and before its window, are masked on the device."""
    if isinstance(start, DevicePosition):
        return _attend(q, k, v, start.index, 0, scale, sinks, window)
    parts = []
    for first, last, first_key in query_blocks(start, q.shape[0], q.shape[1], window):
        positions = torch.arange(first, last, device=q.device)
        parts.append(_attend(q[first - start:last - start], k[first_key:last], v[first_key:last], positions,
                             first_key, scale, sinks, window))
    return parts[0] if len(parts) == 1 else torch.cat(parts)


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor, first_key: int,
            scale: float, sinks: torch.Tensor, window: int | None) -> torch.Tensor:
    """Queries q [C, Hq, D] at `positions` [C] over keys k/v [K, Hkv, D] at positions from
    `first_key`: the keys after a query's position, or before its window, masked."""
    keys = torch.arange(first_key, first_key + k.shape[0], device=q.device)[None, :]
    hidden = keys > positions[:, None]  # [C, K]
    if window is not None:
        hidden |= keys <= positions[:, None] - window
    return _attend_hiding(q, k, v, hidden, scale, sinks)


def sink_masked_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, visible: torch.Tensor, scale: float,
                          sinks: torch.Tensor) -> torch.Tensor:
    """q [T, Hq, D] over k/v [L, Hkv, D] where visible [T, L] (bool) says which keys each query
    sees (DSA's selection: Hy4's sparse attention with sinks); sinks [Hq]. -> [T, Hq, Dv]. Queries
    in blocks whose scores stay within MASKED_SCORES_PER_CALL."""
    t, heads = q.shape[0], q.shape[1]
    block = max(1, MASKED_SCORES_PER_CALL // (heads * max(k.shape[0], 1)))
    parts = [_attend_hiding(q[first:first + block], k, v, ~visible[first:first + block], scale, sinks)
             for first in range(0, t, block)]
    return parts[0] if len(parts) == 1 else torch.cat(parts)


def _attend_hiding(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, hidden: torch.Tensor, scale: float,
                   sinks: torch.Tensor) -> torch.Tensor:
    """Queries q [C, Hq, D] over keys k/v [K, Hkv, D], those where hidden [C, K] masked, beside each
    head's sink logit (float32 softmax, the sink's column dropped)."""
    c, heads, dim = q.shape
    kv_heads = k.shape[1]
    group = heads // kv_heads
    qg = q.reshape(c, kv_heads, group, dim).permute(1, 2, 0, 3)  # [Hkv, G, C, D]: query head h = kv head h // G
    scores = torch.matmul(qg, k.permute(1, 2, 0)[:, None]).to(torch.float32) * scale  # [Hkv, G, C, K]
    scores = scores.masked_fill(hidden, float("-inf"))
    sink = sinks.to(torch.float32).view(kv_heads, group, 1, 1).expand(kv_heads, group, c, 1)
    probs = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1].to(v.dtype)  # (the sink dropped)
    out = torch.matmul(probs, v.permute(1, 0, 2)[:, None])  # [Hkv, G, C, Dv]
    return out.permute(2, 0, 1, 3).reshape(c, heads, v.shape[-1])
