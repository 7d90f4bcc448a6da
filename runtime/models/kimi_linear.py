"""Kimi Linear (kimi_linear, Moonshot AI): a hybrid of Kimi Delta Attention layers (Gated DeltaNet
with a decay per key channel: layers/kimi_delta_attention.py) and multi-head latent attention
layers with no position encoding at all (layers/mla.py, the shared key channels unrotated), as
`layer_types` says (else the release's `linear_attn_config`, its layers numbered from 1). KDA's
forget gate is f_b_proj(f_a_proj x) + dt_bias through -exp(A_log) * softplus, its output gate
g_b_proj(g_a_proj x). Dense SwiGLU MLPs on the `mlp_layer_types` "dense" layers (the first
`first_k_dense_replace`), elsewhere DeepSeek-V3's sigmoid-routed MoE with shared experts
(deepseek_v3.py). The release names its MoE `block_sparse_moe` and its gate's tensors beside the
attention's; both are renamed at conversion (ftw/families.py)."""

from __future__ import annotations

from dataclasses import replace
from types import MappingProxyType

import torch

from ftw.families import kimi_linear_layer_types, kimi_linear_sizes, kimi_linear_view

from ..config import ModelConfig, UnsupportedFamilyError
from ..experts import ExpertExecutor
from ..layers.kimi_delta_attention import KimiDeltaAttention, softplus_decay
from ..layers.linear import linear
from ..layers.mla import MLAttention
from ..loading.read_ftw import ModelWeights
from .base import FFN, Block, DecoderModel, Mixer
from .deepseek_v3 import SigmoidMoE
from .qwen3_moe import dense_mlp

# KimiLinearConfig's defaults, for checkpoints whose config.json leaves a key out
DEFAULTS = dict(n_group=1, topk_group=1, norm_topk_prob=True, routed_scaling_factor=2.446, n_shared_experts=1)

# transformers keeps these in float32 (_keep_in_fp32_modules_strict): routing and decay must not see bf16-rounded values
KEEP_FLOAT32 = ("e_score_correction_bias", "mlp.gate.weight", "dt_bias")


def kda(config: ModelConfig, weights: ModelWeights, prefix: str, dtype: torch.dtype) -> KimiDeltaAttention:
    heads, head_dim = kimi_linear_sizes(dict(config.source))
    f_a, f_b = weights.get(prefix + "forget_gate.f_a_proj.weight"), weights.get(prefix + "forget_gate.f_b_proj.weight")
    dt_bias, a_log = weights.get(prefix + "forget_gate.dt_bias"), weights.get(prefix + "forget_gate.A_log")
    g_a, g_b = weights.get(prefix + "g_a_proj.weight"), weights.get(prefix + "g_b_proj.weight")

    def gate(x: torch.Tensor) -> torch.Tensor:
        gate_input = (linear(linear(x, f_a), f_b).float() + dt_bias.float()).view(x.shape[0], heads, head_dim)
        return softplus_decay(a_log.reshape(1, heads, 1), gate_input)

    return KimiDeltaAttention(weights, prefix, heads=heads, head_dim=head_dim, gate=gate,
                              output_gate=lambda x: linear(linear(x, g_a), g_b), eps=config.rms_norm_eps, dtype=dtype)


def build(config: ModelConfig, weights: ModelWeights, executor: ExpertExecutor, dtype: torch.dtype) -> DecoderModel:
    # (its config.json writes n_group, norm_topk_prob, ... under KimiLinearConfig's attribute_map names)
    config = replace(config, source=MappingProxyType({**config.source, **kimi_linear_view(dict(config.source))}))
    if config.get("hidden_act", "silu") != "silu":
        raise UnsupportedFamilyError(f"kimi_linear with hidden_act {config.get('hidden_act')!r} is not supported")
    try:
        types = kimi_linear_layer_types(dict(config.source))
    except ValueError as e:
        raise UnsupportedFamilyError(str(e)) from None
    blocks = []
    for i, kind in enumerate(types):
        p = f"model.layers.{i}."
        mixer: Mixer = (kda(config, weights, p + "self_attn.", dtype) if kind == "linear_attention"
                        else MLAttention(config, weights, p + "self_attn.", None, dtype, interleave=False))
        ffn: FFN = (SigmoidMoE(config, weights, i, p + "mlp.", executor, DEFAULTS) if i in config.moe_layers
                    else dense_mlp(weights, p + "mlp."))
        blocks.append(Block(weights.get(p + "input_layernorm.weight"), mixer,
                            weights.get(p + "post_attention_layernorm.weight"), ffn))
    return DecoderModel(config, weights, blocks, dtype)
