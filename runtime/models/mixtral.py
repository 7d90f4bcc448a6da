"""Mixtral: the Qwen3-MoE block without q/k norms; routers and experts under `block_sparse_moe`
(under `mlp` where transformers>=5 saved the checkpoint fused); top-k weights always renormalized."""

from __future__ import annotations

import torch

from ..config import ModelConfig, UnsupportedFamilyError
from ..experts import ExpertExecutor
from ..layers.rope import RotaryEmbedding
from ..loading.read_ftw import ModelWeights
from .base import Block, DecoderModel
from .qwen3_moe import GQAAttention, SoftmaxMoE


def moe_prefix(weights: ModelWeights, layer_prefix: str) -> str:
    """Where a layer's router is: `block_sparse_moe.` as the released checkpoints name it, or
    `mlp.` as transformers>=5 saves the fused layout."""
    released = layer_prefix + "block_sparse_moe."
    return released if weights.maybe(released + "gate.weight") is not None else layer_prefix + "mlp."


def build(config: ModelConfig, weights: ModelWeights, executor: ExpertExecutor, dtype: torch.dtype) -> DecoderModel:
    if config.get("sliding_window"):
        raise UnsupportedFamilyError("Mixtral with a sliding attention window is not supported yet")
    rope = RotaryEmbedding(config.head_dim, config.rope_parameters, config.context_length)
    blocks = []
    for i in range(config.num_layers):
        p = f"model.layers.{i}."
        moe = SoftmaxMoE(config, weights, i, moe_prefix(weights, p) + "gate.weight", executor, normalize=True)
        attention = GQAAttention(config, weights, p + "self_attn.", rope, dtype, qk_norm=False)
        blocks.append(Block(weights.get(p + "input_layernorm.weight"), attention,
                            weights.get(p + "post_attention_layernorm.weight"), moe))
    return DecoderModel(config, weights, blocks, dtype)
