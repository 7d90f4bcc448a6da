"""DeepSeek-V3.2 (deepseek_v32): DeepSeek-V3's model (MLA, sigmoid group-limited MoE with shared
experts; deepseek_v3.py) with DeepSeek Sparse Attention on every layer: each runs its own
lightning indexer and attends only to the best `index_topk` earlier tokens. This is GLM-5's DSA
(glm_moe_dsa.py) without its shared layers, the indexer's rotated channels turned as halves
(GLM's as interleaved pairs), and DeepSeek-V3's routing defaults. The multi-token-prediction
layer after `num_hidden_layers` is dropped at conversion."""

from __future__ import annotations

import torch

from ..config import ModelConfig
from ..experts import ExpertExecutor
from ..loading.read_ftw import ModelWeights
from .base import DecoderModel
from .glm_moe_dsa import build_dsa

# DeepseekV32Config's defaults, for checkpoints whose config.json leaves a key out
DEFAULTS = dict(n_group=8, topk_group=4, norm_topk_prob=True, routed_scaling_factor=2.5, n_shared_experts=1)

# transformers keeps these in float32 (_keep_in_fp32_modules[_strict]): routing must not see bf16-rounded values
KEEP_FLOAT32 = ("e_score_correction_bias", "mlp.gate.weight", "indexer.weights_proj.weight")


def build(config: ModelConfig, weights: ModelWeights, executor: ExpertExecutor, dtype: torch.dtype) -> DecoderModel:
    return build_dsa(config, weights, executor, dtype, DEFAULTS, ["full"] * config.num_layers, indexer_interleave=False)
