"""DeepSeek-V4's KV compressors and its lightning indexer, as transformers' deepseek_v4 computes them.

A compressor pools every `rate` consecutive tokens into one compressed KV entry: each token
projects a value (`kv_proj`) and a gate (`gate_proj`); the entry is the softmax-gated sum over its
window (gate + a learned `position_bias` per slot of the window), RMS-normed, then rotated at the
window's first position. With `overlap` (CSA's, and its indexer's) each token projects two series
of `dim` channels: the entry of window w pools window w-1's first series with window w's second,
2 * rate slots. Tokens of a window not yet complete wait in the state until it is.

The indexer (CSA) keeps its own compressor at `index_head_dim` and scores, for each query, every
compressed entry it may see: sum over its heads of weight_h * relu(q_h . k) / sqrt(dim), the
weights a projection of the query token; the query attends to the best `index_topk`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..loading.read_ftw import ModelWeights
from .linear import linear
from .norm import Float32RMSNorm
from .rope import RotaryEmbedding, apply_rotary_pairs


@dataclass
class CompressorState:
    """One compressor's state for one sequence: the compressed entries so far ([count] of
    [max_entries, dim]), the projections of the window not yet complete, and (overlap) the first
    series of the last complete window, which the next window's entry pools."""

    entries: torch.Tensor
    count: int = 0
    pending_kv: torch.Tensor | None = None  # [< rate, series * dim]
    pending_gate: torch.Tensor | None = None
    overlap_kv: torch.Tensor | None = None  # [rate, dim]
    overlap_gate: torch.Tensor | None = None

    @property
    def compressed(self) -> torch.Tensor:
        """The entries so far [count, dim]."""
        return self.entries[: self.count]


class KVCompressor:
    """One compressor under `prefix` (kv_proj, gate_proj, position_bias, kv_norm)."""

    def __init__(self, weights: ModelWeights, prefix: str, *, rate: int, dim: int, overlap: bool,
                 rope: RotaryEmbedding, eps: float) -> None:
        self.kv, self.gate = weights.get(prefix + "kv_proj.weight"), weights.get(prefix + "gate_proj.weight")
        self.position_bias = weights.get(prefix + "position_bias")  # [rate, series * dim], float32
        self.norm = Float32RMSNorm(weights.get(prefix + "kv_norm.weight"), eps)
        self.rate, self.dim, self.overlap, self.rope = rate, dim, overlap, rope

    def new_state(self, max_tokens: int, dtype: torch.dtype) -> CompressorState:
        return CompressorState(torch.zeros(max_tokens // self.rate, self.dim, dtype=dtype))

    def __call__(self, x: torch.Tensor, state: CompressorState) -> None:
        """Take this call's tokens x [T, H] (the ones after those the state has seen); every window
        they complete adds its entry."""
        kv, gate = linear(x, self.kv), linear(x, self.gate)
        if state.pending_kv is not None:
            kv, gate = torch.cat([state.pending_kv, kv]), torch.cat([state.pending_gate, gate])
        usable = kv.shape[0] // self.rate * self.rate
        state.pending_kv, state.pending_gate = kv[usable:], gate[usable:]
        windows = usable // self.rate
        if windows == 0:
            return
        kv = kv[:usable].view(windows, self.rate, -1)  # [W, rate, series * dim]
        gate = gate[:usable].view(windows, self.rate, -1) + self.position_bias
        if self.overlap:
            kv, gate = self._overlapped(kv, gate, state)
        pooled = (kv * gate.softmax(dim=1, dtype=torch.float32).to(kv.dtype)).sum(dim=1)  # [W, dim]
        first = state.count
        positions = torch.arange(first, first + windows) * self.rate  # each window's first position
        cos, sin = self.rope(positions, pooled.dtype)
        entries = apply_rotary_pairs(self.norm(pooled)[:, None, :], cos, sin)[:, 0]
        state.entries[first : first + windows] = entries
        state.count = first + windows

    def _overlapped(self, kv: torch.Tensor, gate: torch.Tensor,
                    state: CompressorState) -> tuple[torch.Tensor, torch.Tensor]:
        """[W, rate, 2 dim] -> [W, 2 rate, dim]: window w's entry pools window w-1's first series
        (slots 0..rate-1; before the first window, nothing: gate -inf) and its own second one."""
        windows, d = kv.shape[0], self.dim
        pooled_kv = kv.new_zeros(windows, 2 * self.rate, d)
        pooled_gate = gate.new_full((windows, 2 * self.rate, d), float("-inf"))
        pooled_kv[:, self.rate :], pooled_gate[:, self.rate :] = kv[..., d:], gate[..., d:]
        pooled_kv[1:, : self.rate], pooled_gate[1:, : self.rate] = kv[:-1, :, :d], gate[:-1, :, :d]
        if state.overlap_kv is not None:
            pooled_kv[0, : self.rate], pooled_gate[0, : self.rate] = state.overlap_kv, state.overlap_gate
        state.overlap_kv, state.overlap_gate = kv[-1, :, :d].clone(), gate[-1, :, :d].clone()
        return pooled_kv, pooled_gate


class LightningIndexer:
    """CSA's indexer under `prefix` (compressor.indexer.*): its compressor, q_b_proj from the low-rank
    query, scorer.weights_proj from the query token."""

    def __init__(self, weights: ModelWeights, prefix: str, *, rate: int, heads: int, dim: int, topk: int,
                 rope: RotaryEmbedding, eps: float) -> None:
        self.compressor = KVCompressor(weights, prefix, rate=rate, dim=dim, overlap=True, rope=rope, eps=eps)
        self.q_b = weights.get(prefix + "q_b_proj.weight")
        self.weights_proj = weights.get(prefix + "scorer.weights_proj.weight")
        self.rate, self.heads, self.dim, self.topk, self.rope = rate, heads, dim, topk, rope

    def queries(self, q_low: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """The indexer's queries [T, heads, dim] from the normalized low-rank query [T, q_lora_rank]."""
        q = linear(q_low, self.q_b).view(q_low.shape[0], self.heads, self.dim)
        cos, sin = self.rope(positions, q.dtype)
        return apply_rotary_pairs(q, cos, sin)

    def select(self, x: torch.Tensor, queries: torch.Tensor, positions: torch.Tensor,
               keys: torch.Tensor) -> torch.Tensor:
        """Which of the E compressed entries each query attends to: bool [T, E]. A query at p sees
        entries w < (p + 1) // rate (windows it has seen complete); of those, its top
        min(index_topk, E) by score, as transformers picks them (top-k over all E, the unseen at
        -inf, then only the seen kept)."""
        seen = torch.arange(keys.shape[0])[None, :] < ((positions + 1) // self.rate)[:, None]  # [T, E]
        scores = torch.relu(torch.matmul(queries.float(), keys.float().T)) * self.dim**-0.5  # [T, heads, E]
        weights = linear(x, self.weights_proj).float() * self.heads**-0.5  # [T, heads]
        scores = (scores * weights[:, :, None]).sum(dim=1).masked_fill(~seen, float("-inf"))
        top = scores.topk(min(self.topk, keys.shape[0]), dim=-1).indices
        return seen & torch.zeros_like(seen).scatter(-1, top, True)
