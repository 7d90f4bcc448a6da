"""Solar Open (solar_open, Upstage): Llama's attention (GQA with full RoPE, optional q/k/v
biases, an o_proj without one) and GLM-4.5's MoE on every layer: sigmoid scores, the correction
bias for the choice, group-limited top-k and shared experts (deepseek_v3.py's router with
Solar's defaults). transformers builds no dense layers and no q/k norms for it, whatever the
config says (SolarOpenConfig drops first_k_dense_replace and use_qk_norm)."""

from __future__ import annotations

import torch

from ..config import ModelConfig, UnsupportedFamilyError
from ..experts import ExpertExecutor
from ..layers.rope import RotaryEmbedding
from ..loading.read_ftw import ModelWeights
from .base import DecoderModel
from .deepseek_v3 import SigmoidMoE, block
from .qwen3_moe import GQAAttention

# SolarOpenConfig's defaults, for checkpoints whose config.json leaves a key out
DEFAULTS = dict(n_group=1, topk_group=1, norm_topk_prob=True, routed_scaling_factor=1.0, n_shared_experts=1)
DEFAULT_THETA = 1_000_000.0  # SolarOpenConfig's, for a config that names no rope base

# transformers keeps these in float32 (_keep_in_fp32_modules_strict): routing must not see bf16-rounded values
KEEP_FLOAT32 = ("e_score_correction_bias", "mlp.gate.weight")


def build(config: ModelConfig, weights: ModelWeights, executor: ExpertExecutor, dtype: torch.dtype) -> DecoderModel:
    params = config.rope_parameters
    if config.get("rope_theta") is None and "rope_theta" not in (config.get("rope_parameters") or {}):
        params["rope_theta"] = DEFAULT_THETA
    factor = params.get("partial_rotary_factor", 1.0)
    if float(factor) != 1.0:  # (transformers' Solar rotates whole heads: another factor does not run there)
        raise UnsupportedFamilyError(f"solar_open with partial_rotary_factor {factor} is not supported")
    rope = RotaryEmbedding(config.head_dim, params, config.context_length)
    blocks = []
    for i in range(config.num_layers):
        p = f"model.layers.{i}."
        attention = GQAAttention(config, weights, p + "self_attn.", rope, dtype, qk_norm=False)
        blocks.append(block(config, weights, i, attention,
                            SigmoidMoE(config, weights, i, p + "mlp.", executor, DEFAULTS)))
    return DecoderModel(config, weights, blocks, dtype)
