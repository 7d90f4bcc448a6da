"""Qwen1.5-MoE and Qwen2-MoE (qwen2_moe): GQA attention with q/k/v biases and no q/k norm
(qwen3_moe.py's), a softmax top-k MoE renormalized only where `norm_topk_prob` says, and a shared
expert gated by sigmoid(`shared_expert_gate`) beside it (qwen3_next.py's block)."""

from __future__ import annotations

import torch

from ..config import ModelConfig, UnsupportedFamilyError
from ..experts import ExpertExecutor
from ..layers.rope import RotaryEmbedding
from ..loader import ModelWeights
from .base import Block, DecoderModel
from .qwen3_moe import GQAAttention, dense_mlp
from .qwen3_next import NormalizedSharedExpertMoE


def build(config: ModelConfig, weights: ModelWeights, executor: ExpertExecutor, dtype: torch.dtype) -> DecoderModel:
    if config.get("use_sliding_window") and config.get("sliding_window"):
        raise UnsupportedFamilyError("Qwen2-MoE with a sliding attention window (use_sliding_window) is not "
                                     "supported yet")
    rope = RotaryEmbedding(config.head_dim, config.rope_parameters, config.context_length)
    blocks = []
    for i in range(config.num_layers):
        p = f"model.layers.{i}."
        # Qwen2MoeConfig's norm_topk_prob defaults to False (Qwen3-Next's to True)
        ffn = (NormalizedSharedExpertMoE(config, weights, i, p + "mlp.", executor, normalize_by_default=False)
               if i in config.moe_layers else dense_mlp(weights, p + "mlp."))
        attention = GQAAttention(config, weights, p + "self_attn.", rope, dtype, qk_norm=False)
        blocks.append(Block(weights.get(p + "input_layernorm.weight"), attention,
                            weights.get(p + "post_attention_layernorm.weight"), ffn))
    return DecoderModel(config, weights, blocks, dtype)
