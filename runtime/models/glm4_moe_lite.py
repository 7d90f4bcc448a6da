"""GLM-4.7-Flash (glm4_moe_lite): DeepSeek-V3's block (multi-head latent attention, RoPE on the
qk_rope_head_dim channels, interleaved by default; deepseek_v3.py) with GLM-4.5's sigmoid-routed
MoE and shared experts, which is DeepSeek-V3's router with GLM's defaults. Which layers are MoE
comes from `mlp_layer_types` (the converter's moe_layers). The multi-token prediction layer after
`num_hidden_layers` is dropped at conversion."""

from __future__ import annotations

import torch

from ..config import ModelConfig
from ..experts import ExpertExecutor
from ..loading.read_ftw import ModelWeights
from .base import DecoderModel
from .deepseek_v3 import build_mla

# Glm4MoeLiteConfig's defaults, for checkpoints whose config.json leaves a key out
DEFAULTS = dict(n_group=1, topk_group=1, norm_topk_prob=True, routed_scaling_factor=1.8, n_shared_experts=1,
                rope_interleave=True)

# transformers keeps these in float32 (_keep_in_fp32_modules): routing must not see bf16-rounded values
KEEP_FLOAT32 = ("e_score_correction_bias", "mlp.gate.weight")


def build(config: ModelConfig, weights: ModelWeights, executor: ExpertExecutor, dtype: torch.dtype) -> DecoderModel:
    return build_mla(config, weights, executor, dtype, DEFAULTS)
