"""OLMoE (olmoe): GQA attention whose q and k RMSNorms run over the whole projection (all heads
at once, before the split into heads), values optionally clipped (`clip_qkv`); every layer a
softmax top-k MoE, renormalized only where `norm_topk_prob` says (qwen3_moe.py's)."""

from __future__ import annotations

import torch

from ..config import ModelConfig
from ..experts import ExpertExecutor
from ..layers.attention import KVCache, Start, causal_attention
from ..layers.linear import linear
from ..layers.norm import rms_norm
from ..layers.rope import RotaryEmbedding, apply_rotary
from ..loading.read_ftw import ModelWeights
from .base import Block, DecoderModel
from .qwen3_moe import GQAAttention, SoftmaxMoE


class WholeProjectionNormAttention(GQAAttention):
    """q_norm over [heads x head_dim] and k_norm over [kv_heads x head_dim], then the heads."""

    def __init__(self, config: ModelConfig, weights: ModelWeights, prefix: str, rope: RotaryEmbedding,
                 dtype: torch.dtype) -> None:
        super().__init__(config, weights, prefix, rope, dtype, qk_norm=True)
        clip = config.get("clip_qkv")
        self.clip = None if clip is None else float(clip)

    def __call__(self, x: torch.Tensor, positions: torch.Tensor, cache: KVCache, start: Start) -> torch.Tensor:
        t = x.shape[0]
        q = rms_norm(linear(x, self.q, self.q_bias), self.q_norm, self.eps)
        k = rms_norm(linear(x, self.k, self.k_bias), self.k_norm, self.eps)
        v = linear(x, self.v, self.v_bias)
        if self.clip is not None:
            q, k, v = (y.clamp(-self.clip, self.clip) for y in (q, k, v))
        q = q.view(t, self.heads, self.head_dim)
        k, v = k.view(t, self.kv_heads, self.head_dim), v.view(t, self.kv_heads, self.head_dim)
        cos, sin = self.rope(positions, x.dtype)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        keys, values = cache.append(start, k, v)
        out = causal_attention(q, keys, values, start, self.scale)
        return linear(out.reshape(t, self.heads * self.head_dim), self.o, self.o_bias)


def build(config: ModelConfig, weights: ModelWeights, executor: ExpertExecutor, dtype: torch.dtype) -> DecoderModel:
    rope = RotaryEmbedding(config.head_dim, config.rope_parameters, config.context_length)
    blocks = []
    for i in range(config.num_layers):
        p = f"model.layers.{i}."
        moe = SoftmaxMoE(config, weights, i, p + "mlp.gate.weight", executor, normalize=bool(config.get("norm_topk_prob")))
        attention = WholeProjectionNormAttention(config, weights, p + "self_attn.", rope, dtype)
        blocks.append(Block(weights.get(p + "input_layernorm.weight"), attention,
                            weights.get(p + "post_attention_layernorm.weight"), moe))
    return DecoderModel(config, weights, blocks, dtype)
