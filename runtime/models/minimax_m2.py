"""MiniMax-M2 (minimax_m2): GQA attention with q/k RMSNorms over the whole projection (olmoe.py's)
and RoPE on the first `rotary_dim` channels of each head; every layer a Mixtral-named MoE routed
by sigmoid scores with a correction bias (the top k chosen by score + bias, weighed by the score,
always renormalized; no groups, no shared experts)."""

from __future__ import annotations

import torch

from ..config import ModelConfig
from ..experts import ExpertExecutor
from ..layers.linear import linear
from ..layers.mlp import sigmoid_group_topk
from ..layers.rope import RotaryEmbedding
from ..loading.read_ftw import ModelWeights
from .base import Block, DecoderModel, Mixer
from .mixtral import moe_prefix
from .olmoe import WholeProjectionNormAttention
from .qwen3_moe import GQAAttention


class BiasedSigmoidMoE:
    """Router (sigmoid, `e_score_correction_bias` for the choice) + routed experts through the executor."""

    def __init__(self, config: ModelConfig, weights: ModelWeights, layer: int, prefix: str,
                 executor: ExpertExecutor) -> None:
        self.router = weights.get(prefix + "gate.weight")
        self.bias = weights.get(prefix + "e_score_correction_bias")
        self.layer, self.executor, self.k = layer, executor, config.num_experts_per_tok

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        # as transformers: the router's product in the model's dtype, the sigmoid in float32
        ids, weights = sigmoid_group_topk(linear(x, self.router).float(), self.bias, self.k, 1, 1, True, 1.0)
        return self.executor(self.layer, x, ids, weights.to(x.dtype))


def rotary(config: ModelConfig) -> RotaryEmbedding:
    """Partial RoPE: `partial_rotary_factor`, or the released checkpoints' `rotary_dim`."""
    factor = config.rope_parameters.get("partial_rotary_factor")
    if factor is None:
        rotary_dim = config.get("rotary_dim")
        factor = 1.0 if rotary_dim is None else int(rotary_dim) / config.head_dim
    return RotaryEmbedding(int(config.head_dim * float(factor)), config.rope_parameters, config.context_length)


def build(config: ModelConfig, weights: ModelWeights, executor: ExpertExecutor, dtype: torch.dtype) -> DecoderModel:
    rope, qk_norm = rotary(config), config.get("use_qk_norm") is not False
    blocks = []
    for i in range(config.num_layers):
        p = f"model.layers.{i}."
        attention: Mixer = (WholeProjectionNormAttention(config, weights, p + "self_attn.", rope, dtype) if qk_norm
                            else GQAAttention(config, weights, p + "self_attn.", rope, dtype, qk_norm=False))
        moe = BiasedSigmoidMoE(config, weights, i, moe_prefix(weights, p), executor)
        blocks.append(Block(weights.get(p + "input_layernorm.weight"), attention,
                            weights.get(p + "post_attention_layernorm.weight"), moe))
    return DecoderModel(config, weights, blocks, dtype)
