"""Tencent Hy3 (hy_v3): Qwen3's attention (GQA, per-head q/k RMSNorms before full RoPE;
qwen3_moe.py) with DeepSeek-V3's feed-forward without groups (deepseek_v3.py): a dense SwiGLU MLP
where `mlp_layer_types` says "dense" (the first layer by default), elsewhere sigmoid scores of a
float32 router, the top k chosen by score + the correction bias, weighed by their scores
renormalized and times `router_scaling_factor`, plus shared experts (`num_shared_experts` of them
as one MLP).

The release's names (mlp.router.gate, mlp.expert_bias, mlp.shared_mlp) are renamed to
transformers' at conversion (ftw/families.py); the bias lies beside the router, not in it. The
multi-token-prediction layer after `num_hidden_layers` is dropped there too.
"""

from __future__ import annotations

import torch

from ..config import ModelConfig, UnsupportedFamilyError
from ..experts import ExpertExecutor
from ..layers.rope import RotaryEmbedding
from ..loading.read_ftw import ModelWeights
from .base import FFN, Block, DecoderModel
from .deepseek_v3 import SigmoidMoE
from .qwen3_moe import GQAAttention, dense_mlp

# HYV3Config's defaults, for a config.json that leaves a key out; no groups, always renormalized
DEFAULTS = dict(n_group=1, topk_group=1, norm_topk_prob=True, router_scaling_factor=2.826, num_shared_experts=1,
                rope_theta=11_158_840.0)

# transformers keeps these in float32 (_keep_in_fp32_modules_strict): routing must not see bf16-rounded values
KEEP_FLOAT32 = ("e_score_correction_bias", "mlp.gate.weight")


def build(config: ModelConfig, weights: ModelWeights, executor: ExpertExecutor, dtype: torch.dtype) -> DecoderModel:
    if config.get("hidden_act", "silu") != "silu" or config.get("mlp_bias", False):
        raise UnsupportedFamilyError("hy_v3 with another hidden_act than silu, or MLP biases, is not supported")
    rope_parameters = config.rope_parameters
    if config.get("rope_theta") is None and "rope_theta" not in (config.get("rope_parameters") or {}):
        rope_parameters["rope_theta"] = DEFAULTS["rope_theta"]  # (HYV3Config's default_theta)
    rope = RotaryEmbedding(config.head_dim, rope_parameters, config.context_length)
    # DeepSeek-V3's keys for SigmoidMoE: Hy3 names its scale router_scaling_factor, its count num_shared_experts
    defaults = {**DEFAULTS, "routed_scaling_factor": float(config.get("router_scaling_factor", DEFAULTS["router_scaling_factor"])),
                "n_shared_experts": int(config.get("num_shared_experts", DEFAULTS["num_shared_experts"]))}
    blocks = []
    for i in range(config.num_layers):
        p = f"model.layers.{i}."
        attention = GQAAttention(config, weights, p + "self_attn.", rope, dtype, qk_norm=True)
        ffn: FFN = (SigmoidMoE(config, weights, i, p + "mlp.", executor, defaults, bias="e_score_correction_bias")
                    if i in config.moe_layers else dense_mlp(weights, p + "mlp."))
        blocks.append(Block(weights.get(p + "input_layernorm.weight"), attention,
                            weights.get(p + "post_attention_layernorm.weight"), ffn))
    return DecoderModel(config, weights, blocks, dtype)
