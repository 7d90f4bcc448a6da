"""GLM-5 (glm_moe_dsa): DeepSeek-V3's block (MLA, sigmoid-routed MoE with shared experts, see
deepseek_v3.py) with DeepSeek Sparse Attention: a light indexer scores every earlier token for
each query and attention sees only the best `index_topk` of them. Layers whose `indexer_types`
entry is "shared" reuse the selection of the last "full" layer before them.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import pairwise
from typing import Any

import torch
import torch.nn.functional as F

from ..config import ModelConfig
from ..experts import ExpertExecutor
from ..layers.attention import Start, store
from ..layers.linear import linear
from ..layers.mla import MLACache, MLAttention
from ..layers.rope import apply_rotary, apply_rotary_interleaved
from ..layers.sink_attention import sink_masked_attention
from ..loading.read_ftw import ModelWeights
from .base import DecoderModel, DecodeState
from .deepseek_v3 import block, ffn, rotary

# GlmMoeDsaConfig's defaults, for checkpoints whose config.json leaves a key out
DEFAULTS = dict(n_group=1, topk_group=1, norm_topk_prob=True, routed_scaling_factor=2.5, n_shared_experts=1)
INDEXER_NORM_EPS = 1e-6  # the indexer's k_norm is nn.LayerNorm(index_head_dim, eps=1e-6)

# transformers keeps these in float32 (_keep_in_fp32_modules): routing must not see bf16-rounded values
KEEP_FLOAT32 = ("e_score_correction_bias", "mlp.gate.weight", "indexer.weights_proj.weight")


class Indexer:
    """DSA's indexer (`self_attn.indexer.*`): per query, a score for every visible token from its
    own small heads (relu(q.k), weighted per head by `weights_proj`), and the top `index_topk`.
    Its rotated channels turn as interleaved pairs (GLM-5's) or as halves (`interleave` false:
    DeepSeek-V3.2's, deepseek_v32.py), and come first in each head, or last (`rope_last`: Hy4's).
    `norm_eps`: k_norm's (GLM's 1e-6; Hy4's rms_norm_eps). k_norm runs in its weight's dtype, the
    keys cast to it and back (Hy4 keeps it float32; GLM's is the model's)."""

    def __init__(self, config: ModelConfig, weights: ModelWeights, prefix: str, *, interleave: bool = True,
                 rope_last: bool = False, norm_eps: float = INDEXER_NORM_EPS) -> None:
        self.wq_b, self.wk = weights.get(prefix + "wq_b.weight"), weights.get(prefix + "wk.weight")
        self.k_norm, self.k_norm_bias = weights.get(prefix + "k_norm.weight"), weights.get(prefix + "k_norm.bias")
        self.weights_proj = weights.get(prefix + "weights_proj.weight")
        self.heads, self.head_dim = int(config.get("index_n_heads")), int(config.get("index_head_dim"))
        self.rope_dim, self.topk = int(config.get("qk_rope_head_dim")), int(config.get("index_topk"))
        self.rotate = apply_rotary_interleaved if interleave else apply_rotary
        self.rope_last, self.norm_eps = rope_last, norm_eps

    def _rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        # unlike MLA, the rotated channels come first here (Hy4's: last, as MLA's)
        if self.rope_last:
            rest, rot = x.split([self.head_dim - self.rope_dim, self.rope_dim], dim=-1)
            return torch.cat((rest, self.rotate(rot, cos, sin)), dim=-1)
        rot, rest = x.split([self.rope_dim, self.head_dim - self.rope_dim], dim=-1)
        return torch.cat((self.rotate(rot, cos, sin), rest), dim=-1)

    def keys(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """This step's indexer keys [T, index_head_dim], as cached for decode."""
        k = linear(x, self.wk)
        k = F.layer_norm(k.to(self.k_norm.dtype), (self.head_dim,), self.k_norm, self.k_norm_bias, self.norm_eps).to(x.dtype)
        return self._rope(k[:, None, :], cos, sin)[:, 0]

    def select(self, x: torch.Tensor, q_low: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
               keys: torch.Tensor, visible: torch.Tensor) -> torch.Tensor:
        """Which tokens each query attends to: visible [T, L] narrowed to its top-k -> [T, L] bool.

        As transformers: scores in float32, invisible tokens at -inf before the top-k, and
        k = min(index_topk, L); a query that sees fewer than k tokens keeps all it sees. Tokens
        tied at the boundary (exactly 0 after the relu) go where torch.topk puts them, which can
        differ between rows of different lengths: then a cached step and a full recompute select
        differently, in transformers as here (tests/test_parity_deepseek.py, "ties"), and so do
        a captured step, which scores a longer span of keys with the later ones masked, and an
        uncaptured one."""
        index_scores = self.scores(x, q_low, cos, sin, keys).masked_fill(~visible, float("-inf"))
        top = index_scores.topk(min(self.topk, keys.shape[0]), dim=-1).indices
        return visible & torch.zeros_like(visible).scatter(-1, top, True)

    def scores(self, x: torch.Tensor, q_low: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
               keys: torch.Tensor) -> torch.Tensor:
        """The indexer's score of every cached token for each query: [T, L] float32."""
        t = x.shape[0]
        q = self._rope(linear(q_low, self.wq_b).view(t, self.heads, self.head_dim), cos, sin)  # [T, h, D]
        scores = torch.relu(torch.matmul(q.float(), keys.float().T) * self.head_dim**-0.5)  # [T, h, L]
        # weights_proj is kept in float32 by transformers (`_keep_in_fp32_modules`)
        weights = F.linear(x.float(), self.weights_proj.float()) * self.heads**-0.5  # [T, h]
        return torch.matmul(weights[:, None, :], scores)[:, 0]


@dataclass
class Selection:
    """The tokens each query of the current step may attend to ([T, L] bool), written by a "full"
    layer and read by the "shared" layers after it; one per sequence."""

    visible: torch.Tensor | None = None


@dataclass
class DSACache:
    mla: MLACache
    index_keys: torch.Tensor | None  # [max_tokens, index_head_dim]; None on "shared" layers
    selection: Selection


class DSAttention:
    """MLA whose queries see only the tokens the indexer selected. At a DevicePosition (a
    captured decode step) the indexer scores the span's tokens, those after the position masked;
    the selection a shared layer reads is the full layer's output within the same step. `sinks`
    [heads]: a learned sink logit per head in each query's softmax (Hy4's; layers/sink_attention.py)."""

    takes_device_position = True  # a decode call may be captured in a CUDA graph (base.Mixer)

    def __init__(self, mla: MLAttention, indexer: Indexer | None, index_head_dim: int,
                 sinks: torch.Tensor | None = None) -> None:
        self.mla, self.indexer, self.index_head_dim, self.sinks = mla, indexer, index_head_dim, sinks

    def new_cache(self, max_tokens: int) -> DSACache:
        keys = None if self.indexer is None else torch.zeros(max_tokens, self.index_head_dim, dtype=self.mla.dtype)
        return DSACache(self.mla.new_cache(max_tokens), keys, Selection())

    def __call__(self, x: torch.Tensor, positions: torch.Tensor, cache: DSACache, start: Start) -> torch.Tensor:
        t = x.shape[0]
        assert self.mla.rope is not None, "DSA's MLA rotates its shared key"
        cos, sin = self.mla.rope(positions, x.dtype)
        q, q_low = self.mla.query(x, cos, sin)
        k, v = self.mla.keys_values(x, cos, sin, cache.mla, start)
        length = k.shape[0]
        if self.indexer is not None and cache.index_keys is not None:
            keys = store(cache.index_keys, start, self.indexer.keys(x, cos, sin))
            visible = torch.arange(length)[None, :] <= positions[:, None]  # causal [T, L]
            if length > self.indexer.topk:  # otherwise every token is selected: the causal mask is all
                assert q_low is not None
                visible = self.indexer.select(x, q_low, cos, sin, keys, visible)
            cache.selection.visible = visible
        visible = cache.selection.visible
        assert visible is not None and visible.shape == (t, length), "a shared DSA layer ran before its full layer"
        if self.sinks is not None:
            return self.mla.output(sink_masked_attention(q, k, v, visible, self.mla.scale, self.sinks))
        # 4-D: the CPU flash kernel's form (3-D takes the math path, which keeps [heads, T, L] scores)
        out = F.scaled_dot_product_attention(q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
                                             attn_mask=visible, scale=self.mla.scale)[0]  # [heads, T, v_dim]
        return self.mla.output(out.transpose(0, 1))


class DSAModel(DecoderModel):
    """The decoder, with each "shared" layer's cache pointing at the selection of the last "full"
    layer before it (transformers passes `prev_topk_indices` up the layers)."""

    def new_state(self, max_tokens: int) -> DecodeState:
        state = super().new_state(max_tokens)
        for before, cache in pairwise(state.caches):
            if cache.index_keys is None:
                cache.selection = before.selection
        return state


def indexer_types(config: ModelConfig) -> list[str]:
    """"full" or "shared" per layer: `indexer_types`, else derived as GlmMoeDsaConfig does."""
    if config.get("indexer_types") is not None:
        return list(config.get("indexer_types"))
    pattern = config.get("index_topk_pattern")
    if pattern is not None:
        return [{"F": "full", "S": "shared"}[c] for c in pattern] if isinstance(pattern, str) else list(pattern)
    freq, offset = max(int(config.get("index_topk_freq", 1)), 1), int(config.get("index_skip_topk_offset", 2))
    return ["full" if max(i - offset + 1, 0) % freq == 0 else "shared" for i in range(config.num_layers)]


def build(config: ModelConfig, weights: ModelWeights, executor: ExpertExecutor, dtype: torch.dtype) -> DecoderModel:
    return build_dsa(config, weights, executor, dtype, DEFAULTS, indexer_types(config), indexer_interleave=True)


def build_dsa(config: ModelConfig, weights: ModelWeights, executor: ExpertExecutor, dtype: torch.dtype,
              defaults: dict[str, Any], kinds: list[str], *, indexer_interleave: bool) -> DecoderModel:
    """The DSA model with a family's `defaults`, "full"/"shared" layer `kinds` and indexer rotation
    (DeepSeek-V3.2's is this model with every layer full and its indexer's halves turned)."""
    if config.get("q_lora_rank") is None:
        raise ValueError(f"{config.family} needs q_lora_rank: its indexer reads the low-rank query")
    if kinds[0] != "full":
        raise ValueError(f"indexer_types {kinds} starts with {kinds[0]!r}: layer 0 has no selection to share")
    rope, blocks = rotary(config), []
    for i in range(config.num_layers):
        p = f"model.layers.{i}.self_attn."
        mla = MLAttention(config, weights, p, rope, dtype, interleave=True)  # (both always interleave MLA's)
        indexer = Indexer(config, weights, p + "indexer.", interleave=indexer_interleave) if kinds[i] == "full" else None
        attention = DSAttention(mla, indexer, int(config.get("index_head_dim")))
        blocks.append(block(config, weights, i, attention, ffn(config, weights, i, executor, defaults)))
    return DSAModel(config, weights, blocks, dtype)
