"""DeepSeek-V4's attention, as transformers' DeepseekV4Attention computes it (eager, its only form).

One key-value head shared by every query head, its keys being its values (K = V): the query goes
through a low-rank bottleneck (q_a_proj -> RMSNorm -> q_b_proj) and a weightless RMSNorm per head,
the key through kv_proj and an RMSNorm; both rotate their last `qk_rope_head_dim` channels as
pairs (rope.apply_rotary_pairs). A query at p sees:
- the keys of the last `sliding_window` positions (p - window, p], every layer;
- "compressed_sparse_attention" (CSA) layers: entries of a compressor of every `rate` tokens
  (overlapping windows), the best `index_topk` of those it has seen by the lightning indexer;
- "heavily_compressed_attention" (HCA) layers: every entry it has seen of a compressor of every
  `rate` tokens (non-overlapping windows, rate 128 in the release);
- a learned sink per head: a logit in the softmax with no value (as gpt-oss's).
The output's rotated channels are turned back (sin negated) at the query's position, since the
values carry the keys' rotation; then a grouped low-rank output projection: the heads in
`o_groups` groups, each projected to `o_lora_rank` (o_a_proj), the groups mixed (o_b_proj).

The cache holds the window's last `sliding_window - 1` keys and the compressors' states; it moves
with every token (as transformers' DeepseekV4HCACache / CSACache) and cannot be taken back.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..loading.read_ftw import ModelWeights
from .attention import MASKED_SCORES_PER_CALL, Start
from .kv_compressor import CompressorState, KVCompressor, LightningIndexer
from .linear import linear
from .norm import Float32RMSNorm, unweighted_rms_norm
from .recurrent_state import RecurrentRewindError
from .rope import RotaryEmbedding, apply_rotary_pairs

SLIDING, CSA, HCA = "sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention"
LAYER_TYPES = (SLIDING, CSA, HCA)


@dataclass
class CompressedKVCache:
    """One layer's state for one sequence: the keys of the last window - 1 positions before
    `length`, and its compressors' states (none on sliding layers)."""

    window: torch.Tensor  # [<= sliding_window - 1, head_dim]
    compressor: CompressorState | None = None
    indexer: CompressorState | None = None
    length: int = 0

    def seek(self, start: int) -> None:
        """Start a call at `start`: 0 a new sequence (its states dropped); else the position after
        the last one seen, or RecurrentRewindError."""
        if start == 0:
            self.window, self.length = self.window[:0], 0
            for state in (self.compressor, self.indexer):
                if state is not None:
                    state.count, state.pending_kv, state.pending_gate = 0, None, None
                    state.overlap_kv = state.overlap_gate = None
        elif start != self.length:
            raise RecurrentRewindError(
                f"a compressed-attention state at token {self.length} cannot continue from token {start}; "
                "its window and compressors move with every token: restart the sequence from token 0")


@dataclass(frozen=True)
class CompressedAttentionConfig:
    """The sizes of one layer (from the config: runtime/models/deepseek_v4.py)."""

    kind: str  # one of LAYER_TYPES
    heads: int
    head_dim: int
    rope_dim: int
    window: int
    o_groups: int
    rate: int = 0  # the compressor's (CSA, HCA)
    index_heads: int = 0  # the indexer's (CSA)
    index_head_dim: int = 0
    index_topk: int = 0
    eps: float = 1e-6


class CompressedAttention:
    """The mixer of one layer under `prefix` (self_attn.*); `rope` the layer's (sliding layers the
    "main" one, the others the "compress" one, which their compressors and indexer share)."""

    recurrent = True  # its cache moves with every token and cannot be moved back (base.Mixer)
    chunks_prompt = True  # a long prompt may come in chunks, each continuing the state (base.Mixer)

    def __init__(self, c: CompressedAttentionConfig, weights: ModelWeights, prefix: str, rope: RotaryEmbedding,
                 dtype: torch.dtype) -> None:
        self.c, self.rope, self.dtype = c, rope, dtype
        self.q_a, self.q_b = weights.get(prefix + "q_a_proj.weight"), weights.get(prefix + "q_b_proj.weight")
        self.q_a_norm = Float32RMSNorm(weights.get(prefix + "q_a_norm.weight"), c.eps)
        self.kv = weights.get(prefix + "kv_proj.weight")
        self.kv_norm = Float32RMSNorm(weights.get(prefix + "kv_norm.weight"), c.eps)
        o_a = weights.get(prefix + "o_a_proj.weight")  # [groups * o_lora_rank, heads * head_dim / groups]
        self.o_a = o_a.view(c.o_groups, o_a.shape[0] // c.o_groups, o_a.shape[1])  # [groups, rank, in]
        self.o_b = weights.get(prefix + "o_b_proj.weight")
        self.sinks = weights.get(prefix + "sinks")  # [heads], float32
        self.scale = c.head_dim**-0.5
        self.compressor = self.indexer = None
        if c.kind in (CSA, HCA):
            self.compressor = KVCompressor(weights, prefix + "compressor.", rate=c.rate, dim=c.head_dim,
                                           overlap=c.kind == CSA, rope=rope, eps=c.eps)
        if c.kind == CSA:
            self.indexer = LightningIndexer(weights, prefix + "compressor.indexer.", rate=c.rate, heads=c.index_heads,
                                            dim=c.index_head_dim, topk=c.index_topk, rope=rope, eps=c.eps)

    def new_cache(self, max_tokens: int) -> CompressedKVCache:
        return CompressedKVCache(
            torch.zeros(0, self.c.head_dim, dtype=self.dtype),
            None if self.compressor is None else self.compressor.new_state(max_tokens, self.dtype),
            None if self.indexer is None else self.indexer.compressor.new_state(max_tokens, self.dtype))

    def __call__(self, x: torch.Tensor, positions: torch.Tensor, cache: CompressedKVCache, start: Start) -> torch.Tensor:
        assert isinstance(start, int), "compressed attention is not captured (it takes no DevicePosition)"
        cache.seek(start)
        t, c = x.shape[0], self.c
        cos, sin = self.rope(positions, x.dtype)
        q_low = self.q_a_norm(linear(x, self.q_a))  # [T, q_lora_rank]
        q = unweighted_rms_norm(linear(q_low, self.q_b).view(t, c.heads, c.head_dim), c.eps)
        q = apply_rotary_pairs(q, cos, sin)  # [T, heads, D]
        kv = apply_rotary_pairs(self.kv_norm(linear(x, self.kv))[:, None, :], cos, sin)[:, 0]  # [T, D]
        window = torch.cat([cache.window, kv])  # positions [start - len(cache.window), start + T)
        cache.window = window[max(0, window.shape[0] - (c.window - 1)):]
        entries, queries = None, None
        if self.compressor is not None and cache.compressor is not None:
            self.compressor(x, cache.compressor)
            entries = cache.compressor.compressed  # [E, D]
        if self.indexer is not None and cache.indexer is not None:
            self.indexer.compressor(x, cache.indexer)
            queries = self.indexer.queries(q_low, positions)
        cache.length = start + t
        out = torch.empty_like(q)
        first_key = start - (window.shape[0] - t)  # the position of window[0]
        keys_per_query = c.window + (0 if entries is None else entries.shape[0])
        block = max(1, MASKED_SCORES_PER_CALL // (c.heads * keys_per_query))
        for i in range(0, t, block):  # queries in blocks whose scores stay within MASKED_SCORES_PER_CALL
            j = min(t, i + block)
            out[i:j] = self._attend(q[i:j], x[i:j], start + i, positions[i:j], window, first_key, entries,
                                    None if queries is None else queries[i:j], cache)
        out = apply_rotary_pairs(out, cos, -sin)  # the values' rotation turned back at the query's position
        grouped = out.reshape(t, c.o_groups, -1).transpose(0, 1)  # [groups, T, heads * D / groups]
        low = torch.bmm(grouped, self.o_a.transpose(1, 2)).transpose(0, 1).reshape(t, -1)  # [T, groups * rank]
        return linear(low, self.o_b)

    def _attend(self, q: torch.Tensor, x: torch.Tensor, first: int, positions: torch.Tensor, window: torch.Tensor,
                first_key: int, entries: torch.Tensor | None, queries: torch.Tensor | None,
                cache: CompressedKVCache) -> torch.Tensor:
        """q [C, heads, D] at `positions` (from `first`) over the window keys they reach and the
        compressed entries they may see, with the sinks -> [C, heads, D]."""
        c = self.c
        low = max(0, first - c.window + 1 - first_key)
        keys = window[low : first + q.shape[0] - first_key]  # [K, D]
        key_positions = torch.arange(first_key + low, first_key + low + keys.shape[0])
        visible = (key_positions[None, :] <= positions[:, None]) & (key_positions[None, :] > positions[:, None] - c.window)
        if entries is not None and entries.shape[0]:
            if self.indexer is not None and queries is not None and cache.indexer is not None:
                seen = self.indexer.select(x, queries, positions, cache.indexer.compressed)
            else:  # HCA: every complete window before the query
                seen = torch.arange(entries.shape[0])[None, :] < ((positions + 1) // c.rate)[:, None]
            keys, visible = torch.cat([keys, entries]), torch.cat([visible, seen], dim=1)
        scores = (torch.matmul(q.transpose(0, 1), keys.T) * self.scale).float()  # [heads, C, K]
        scores = scores.masked_fill(~visible, float("-inf"))
        sinks = self.sinks.float()[:, None, None].expand(-1, q.shape[0], 1)
        logits = torch.cat([scores, sinks], dim=-1)
        probs = torch.softmax(logits - logits.amax(dim=-1, keepdim=True), dim=-1)[..., :-1]
        return torch.matmul(probs.to(keys.dtype), keys).transpose(0, 1)  # [C, heads, D]
