"""GLM-4.5, 4.6 and 4.7 (glm4_moe): Qwen3-MoE's GQA attention (biases on q/k/v, per-head q/k
RMSNorm where `use_qk_norm`) with RoPE on the first `partial_rotary_factor` of each head's
channels, and DeepSeek-V3's feed-forward: dense MLPs on the first `first_k_dense_replace`
layers, then a sigmoid-routed MoE with shared experts (deepseek_v3.py). The multi-token
prediction layer after `num_hidden_layers` is dropped at conversion."""

from __future__ import annotations

import torch

from ..config import ModelConfig
from ..experts import ExpertExecutor
from ..layers.rope import partial_rotary
from ..loading.read_ftw import ModelWeights
from .base import DecoderModel
from .deepseek_v3 import block, ffn
from .qwen3_moe import GQAAttention

# Glm4MoeConfig's defaults, for checkpoints whose config.json leaves a key out
DEFAULTS = dict(n_group=1, topk_group=1, norm_topk_prob=True, routed_scaling_factor=1.0, n_shared_experts=1)
PARTIAL_ROTARY_FACTOR = 0.5

# transformers keeps these in float32 (_keep_in_fp32_modules): routing must not see bf16-rounded values
KEEP_FLOAT32 = ("e_score_correction_bias", "mlp.gate.weight")


def build(config: ModelConfig, weights: ModelWeights, executor: ExpertExecutor, dtype: torch.dtype) -> DecoderModel:
    rope, qk_norm = partial_rotary(config, PARTIAL_ROTARY_FACTOR), bool(config.get("use_qk_norm", False))
    blocks = []
    for i in range(config.num_layers):
        attention = GQAAttention(config, weights, f"model.layers.{i}.self_attn.", rope, dtype, qk_norm=qk_norm)
        blocks.append(block(config, weights, i, attention, ffn(config, weights, i, executor, DEFAULTS)))
    return DecoderModel(config, weights, blocks, dtype)
