"""Qwen1.5-MoE and Qwen2-MoE (qwen2_moe): GQA attention with q/k/v biases and no q/k norm
(qwen3_moe.py's), a softmax top-k MoE renormalized only where `norm_topk_prob` says, and a shared
expert gated by sigmoid(`shared_expert_gate`) beside it (qwen3_next.py's block)."""

from __future__ import annotations

import torch

from ..config import ModelConfig
from ..experts import ExpertExecutor
from ..loading.read_ftw import ModelWeights
from .base import DecoderModel
from .qwen3_moe import gqa_moe_model
from .qwen3_next import NormalizedSharedExpertMoE


def build(config: ModelConfig, weights: ModelWeights, executor: ExpertExecutor, dtype: torch.dtype) -> DecoderModel:
    # Qwen2MoeConfig's norm_topk_prob defaults to False (Qwen3-Next's to True)
    return gqa_moe_model(config, weights, dtype, name="Qwen2-MoE", qk_norm=False, moe=lambda layer, prefix: (
        NormalizedSharedExpertMoE(config, weights, layer, prefix, executor, normalize_by_default=False)))
