"""OpenBMB MiniCPM5-MoE (minicpm5_moe): DeepSeek-V3's feed-forward (deepseek_v3.py: dense MLPs where
`mlp_layer_types` says "dense", else a sigmoid-routed MoE with a correction bias, group-limited
top-k, renormalized and scaled weights, and shared experts) under Llama's GQA attention (full
RoPE, no q/k norms) with a gated output: q_proj holds each head's queries and its gate side by
side, and the attended values are weighed by sigmoid of the gate before o_proj (the gated
attention Qwen3.5 has, without its norms: qwen3_5_moe.GatedAttention).

The release names the fused query-and-gate projection q_proj, transformers q_gate_proj (its own
layout, renamed back at conversion: ftw/families.py).
"""

from __future__ import annotations

import torch

from ..config import ModelConfig, UnsupportedFamilyError
from ..experts import ExpertExecutor
from ..layers.rope import RotaryEmbedding
from ..loading.read_ftw import ModelWeights
from .base import DecoderModel
from .deepseek_v3 import block, ffn
from .qwen3_5_moe import GatedAttention

# MiniCPM5MoeConfig's defaults, for a config.json that leaves a key out
DEFAULTS = dict(n_group=1, topk_group=1, norm_topk_prob=True, routed_scaling_factor=3.66, n_shared_experts=1)

# transformers routes in float32 whatever the model dtype: routing must not see bf16-rounded values
KEEP_FLOAT32 = ("e_score_correction_bias", "mlp.gate.weight")


def build(config: ModelConfig, weights: ModelWeights, executor: ExpertExecutor, dtype: torch.dtype) -> DecoderModel:
    if config.get("use_gated_attention", True) is False:  # (transformers refuses it too)
        raise UnsupportedFamilyError("MiniCPM5-MoE with use_gated_attention false is not supported")
    rope = RotaryEmbedding(config.head_dim, config.rope_parameters, config.context_length)
    blocks = []
    for i in range(config.num_layers):
        attention = GatedAttention(config, weights, f"model.layers.{i}.self_attn.", rope, dtype, qk_norm=False)
        blocks.append(block(config, weights, i, attention, ffn(config, weights, i, executor, DEFAULTS)))
    return DecoderModel(config, weights, blocks, dtype)
