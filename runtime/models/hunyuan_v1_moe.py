"""Hunyuan-A13B (hunyuan_v1_moe): GQA attention whose per-head q/k RMSNorms (`query_layernorm`,
`key_layernorm`) come after RoPE, not before it as in Qwen3; RoPE as its checkpoints configure it,
"dynamic" with a fixed NTK `alpha` (layers/rope.py); every layer a softmax top-k MoE, always
renormalized, routed in float32 (transformers keeps `gate.wg` in float32), with one shared SwiGLU
(`shared_mlp`, `intermediate_size` wide) added. config.json may list `moe_topk` once per layer;
the converter takes it where all layers agree."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..config import ModelConfig
from ..experts import ExpertExecutor
from ..layers.attention import KVCache, Start, causal_attention
from ..layers.linear import linear
from ..layers.mlp import softmax_topk
from ..layers.norm import rms_norm
from ..layers.rope import RotaryEmbedding, apply_rotary
from ..loading.read_ftw import ModelWeights
from .base import Block, DecoderModel
from .qwen3_moe import GQAAttention, dense_mlp

# transformers makes the router in float32 whatever the model dtype (HunYuanMoEV1Gate's `wg`)
KEEP_FLOAT32 = ("mlp.gate.wg.weight",)


class NormAfterRotaryAttention(GQAAttention):
    """GQA attention with per-head q/k RMSNorms applied to the rotated queries and keys."""

    def __init__(self, config: ModelConfig, weights: ModelWeights, prefix: str, rope: RotaryEmbedding,
                 dtype: torch.dtype) -> None:
        super().__init__(config, weights, prefix, rope, dtype, qk_norm=False)
        self.query_norm = weights.get(prefix + "query_layernorm.weight")  # [D]
        self.key_norm = weights.get(prefix + "key_layernorm.weight")

    def __call__(self, x: torch.Tensor, positions: torch.Tensor, cache: KVCache, start: Start) -> torch.Tensor:
        t = x.shape[0]
        q = linear(x, self.q, self.q_bias).view(t, self.heads, self.head_dim)  # [T, Hq, D]
        k = linear(x, self.k, self.k_bias).view(t, self.kv_heads, self.head_dim)  # [T, Hkv, D]
        v = linear(x, self.v, self.v_bias).view(t, self.kv_heads, self.head_dim)
        cos, sin = self.rope(positions, x.dtype)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        q, k = rms_norm(q, self.query_norm, self.eps), rms_norm(k, self.key_norm, self.eps)
        keys, values = cache.append(start, k, v)
        out = causal_attention(q, keys, values, start, self.scale)
        return linear(out.reshape(t, self.heads * self.head_dim), self.o, self.o_bias)


class SharedMLPMoE:
    """Router (float32 softmax top-k, renormalized) + routed experts through the executor + the
    shared MLP added to their output."""

    def __init__(self, config: ModelConfig, weights: ModelWeights, layer: int, prefix: str,
                 executor: ExpertExecutor) -> None:
        self.router = weights.get(prefix + "gate.wg.weight")
        self.shared = dense_mlp(weights, prefix + "shared_mlp.")
        self.layer, self.executor, self.k = layer, executor, config.num_experts_per_tok

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        logits = F.linear(x.to(torch.float32), self.router.to(torch.float32))
        ids, weights = softmax_topk(logits, self.k, True)
        return self.executor(self.layer, x, ids, weights.to(x.dtype)) + self.shared(x)


def build(config: ModelConfig, weights: ModelWeights, executor: ExpertExecutor, dtype: torch.dtype) -> DecoderModel:
    rope = RotaryEmbedding(config.head_dim, config.rope_parameters, config.context_length)
    blocks = []
    for i in range(config.num_layers):
        p = f"model.layers.{i}."
        attention = NormAfterRotaryAttention(config, weights, p + "self_attn.", rope, dtype)
        moe = SharedMLPMoE(config, weights, i, p + "mlp.", executor)
        blocks.append(Block(weights.get(p + "input_layernorm.weight"), attention,
                            weights.get(p + "post_attention_layernorm.weight"), moe))
    return DecoderModel(config, weights, blocks, dtype)
