"""Sarvam-30B (sarvam_moe) and BharatGen Param2 (param2moe): GLM-4.5's model (glm4_moe.py), as
transformers runs both (Glm4MoeForCausalLM): GQA attention with per-head q/k RMSNorm
(`use_qk_norm`) and biases on q/k/v where `attention_bias`, dense MLPs on the first
`first_k_dense_replace` layers, then DeepSeek-V3's sigmoid-routed MoE with shared experts
(deepseek_v3.py). Unlike GLM, RoPE covers the whole head (`partial_rotary_factor` 1).

The releases name things their own way (transformers' conversion_mapping renames them): the
converter renames embeddings, o_proj, q/k norms and the correction bias (ftw/families.py); the
fused `attention.query_key_value` [(Hq + 2 Hkv) D, H], queries' rows then keys' then values', is
read apart here (row blocks of one matrix: views, no copy). Their config.json says num_experts,
num_shared_experts and use_qkv_bias (`sarvam_moe_view`).
"""

from __future__ import annotations

from dataclasses import replace
from types import MappingProxyType

import torch

from ftw.families import sarvam_moe_view

from ..config import ModelConfig
from ..experts import ExpertExecutor
from ..layers.rope import partial_rotary
from ..loading.read_ftw import ModelWeights
from .base import DecoderModel
from .deepseek_v3 import block, ffn
from .qwen3_moe import GQAAttention

# SarvamMoEConfig's defaults (Param2MoeConfig's are the same), for a config.json that leaves a key out
DEFAULTS = dict(n_group=1, topk_group=1, norm_topk_prob=True, routed_scaling_factor=2.5, n_shared_experts=1)
PARTIAL_ROTARY_FACTOR = 1.0

# transformers keeps these in float32 (_keep_in_fp32_modules): routing must not see bf16-rounded values
KEEP_FLOAT32 = ("e_score_correction_bias", "mlp.gate.weight")


def split_qkv(config: ModelConfig, weights: ModelWeights, name: str = "query_key_value") -> ModelWeights:
    """`weights` with each layer's fused `self_attn.<name>` (weight and bias; Ergo's qkv_proj) as the
    q_proj, k_proj and v_proj transformers splits it into; a checkpoint in transformers' own
    layout has those already."""
    rows = [config.num_attention_heads * config.head_dim] + [config.num_key_value_heads * config.head_dim] * 2
    dense = dict(weights.dense)
    for i in range(config.num_layers):
        prefix = f"model.layers.{i}.self_attn."
        for what in ("weight", "bias"):
            fused = dense.pop(f"{prefix}{name}.{what}", None)
            if fused is not None:
                for proj, part in zip(("q_proj", "k_proj", "v_proj"), fused.split(rows), strict=True):
                    dense[f"{prefix}{proj}.{what}"] = part
    return replace(weights, dense=dense)


def build(config: ModelConfig, weights: ModelWeights, executor: ExpertExecutor, dtype: torch.dtype) -> DecoderModel:
    config = replace(config, source=MappingProxyType({**config.source, **sarvam_moe_view(dict(config.source))}))
    weights = split_qkv(config, weights)
    rope, qk_norm = partial_rotary(config, PARTIAL_ROTARY_FACTOR), bool(config.get("use_qk_norm", True))
    blocks = []
    for i in range(config.num_layers):
        attention = GQAAttention(config, weights, f"model.layers.{i}.self_attn.", rope, dtype, qk_norm=qk_norm)
        blocks.append(block(config, weights, i, attention, ffn(config, weights, i, executor, DEFAULTS)))
    return DecoderModel(config, weights, blocks, dtype)
