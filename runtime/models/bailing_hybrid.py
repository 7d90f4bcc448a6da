"""Ling's hybrid MoE (bailing_hybrid, inclusionAI): Kimi Linear's block with its own parts. Kimi Delta
Attention layers (layers/kimi_delta_attention.py) whose forget gate is one projection plus
dt_bias, bounded where `kda_safe_gate` (lower_bound * sigmoid(exp(A_log) * g), else
-exp(A_log) * softplus(g)) and whose output gate is g_proj; every `layer_group_size`-th layer is
multi-head latent attention (interleaved RoPE on the shared key channels; layers/mla.py) with a
sigmoid gate per head (g_proj) on its output. Dense SwiGLU MLPs on the first
`first_k_dense_replace` layers (`mlp_layer_types`), then DeepSeek-V3's sigmoid-routed MoE with
shared experts (deepseek_v3.py). The release's names (word_embeddings, attention, dense,
expert_bias, the forget gate's tensors beside the attention's) are renamed at conversion, and
its multi-token-prediction layers after `num_hidden_layers` dropped (ftw/families.py)."""

from __future__ import annotations

from dataclasses import replace
from types import MappingProxyType
from typing import Any

import torch
import torch.nn.functional as F

from ftw.families import bailing_hybrid_view

from ..config import ModelConfig, UnsupportedFamilyError
from ..experts import ExpertExecutor
from ..layers.attention import Start, causal_attention
from ..layers.kimi_delta_attention import KimiDeltaAttention
from ..layers.linear import linear
from ..layers.mla import MLACache, MLAttention
from ..layers.rope import RotaryEmbedding
from ..loading.read_ftw import ModelWeights
from .base import FFN, Block, DecoderModel, Mixer
from .deepseek_v3 import SigmoidMoE, rotary
from .layer_schedule import layer_types as checked_layer_types
from .qwen3_moe import dense_mlp

# BailingHybridConfig's defaults, for checkpoints whose config.json leaves a key out
DEFAULTS = dict(n_group=8, topk_group=4, norm_topk_prob=True, routed_scaling_factor=2.5, n_shared_experts=1,
                layer_group_size=6, kda_safe_gate=True, kda_lower_bound=-5.0, rope_theta=6_000_000.0,
                short_conv_kernel_size=4)

# transformers keeps these in float32 (_keep_in_fp32_modules_strict)
KEEP_FLOAT32 = ("e_score_correction_bias", "mlp.gate.weight", "conv1d.weight", "dt_bias", "A_log")


class HeadGatedMLA(MLAttention):
    """MLA whose output is gated per head by sigmoid(g_proj x) before o_proj."""

    def __init__(self, config: ModelConfig, weights: ModelWeights, prefix: str, rope: RotaryEmbedding,
                 dtype: torch.dtype) -> None:
        super().__init__(config, weights, prefix, rope, dtype, interleave=True)
        self.gate = weights.get(prefix + "g_proj.weight")  # [heads, H]

    def __call__(self, x: torch.Tensor, positions: torch.Tensor, cache: MLACache, start: Start) -> torch.Tensor:
        assert self.rope is not None
        cos, sin = self.rope(positions, x.dtype)
        q, _ = self.query(x, cos, sin)
        k, v = self.keys_values(x, cos, sin, cache, start)
        gate = torch.sigmoid(linear(x, self.gate).float()).to(x.dtype)  # [T, heads]
        return self.output(causal_attention(q, k, v, start, self.scale) * gate[:, :, None])


def kda(config: ModelConfig, weights: ModelWeights, prefix: str, dtype: torch.dtype) -> KimiDeltaAttention:
    heads = int(config.get("linear_num_heads", config.num_attention_heads))
    head_dim = int(config.get("linear_head_dim", config.get("head_dim")))
    f_proj, dt_bias = weights.get(prefix + "forget_gate.f_proj.weight"), weights.get(prefix + "forget_gate.dt_bias")
    rate = weights.get(prefix + "forget_gate.A_log").float().exp().view(1, heads, 1)
    safe, bound = bool(config.get("kda_safe_gate", DEFAULTS["kda_safe_gate"])), float(
        config.get("kda_lower_bound", DEFAULTS["kda_lower_bound"]))
    g_proj = weights.get(prefix + "g_proj.weight")

    def gate(x: torch.Tensor) -> torch.Tensor:
        gate_input = linear(x, f_proj).float().view(x.shape[0], heads, head_dim) + dt_bias.float().view(1, heads, head_dim)
        g = bound * torch.sigmoid(rate * gate_input) if safe else -rate * F.softplus(gate_input)
        return g.to(x.dtype)  # (transformers' gate returns the model dtype)

    return KimiDeltaAttention(weights, prefix, heads=heads, head_dim=head_dim, gate=gate,
                              output_gate=lambda x: linear(x, g_proj), eps=config.rms_norm_eps, dtype=dtype)


def layer_types(config: ModelConfig) -> list[str]:
    every = int(config.get("layer_group_size", DEFAULTS["layer_group_size"]))
    return checked_layer_types(config, "bailing_hybrid",
                               lambda i: "full_attention" if (i + 1) % every == 0 else "linear_attention",
                               kinds=("full_attention", "linear_attention"))


def build(config: ModelConfig, weights: ModelWeights, executor: ExpertExecutor, dtype: torch.dtype) -> DecoderModel:
    # (its config.json writes n_group, norm_topk_prob, ... under BailingHybridConfig's attribute_map names)
    config = replace(config, source=MappingProxyType({**config.source, **bailing_hybrid_view(dict(config.source))}))
    if config.get("hidden_act", "silu") != "silu":
        raise UnsupportedFamilyError(f"bailing_hybrid with hidden_act {config.get('hidden_act')!r} is not supported")
    source: dict[str, Any] = dict(config.source)
    if config.get("rope_parameters") is None and config.get("rope_theta") is None:
        source["rope_theta"] = DEFAULTS["rope_theta"]
    rope = rotary(replace(config, source=MappingProxyType(source)))
    blocks = []
    for i, kind in enumerate(layer_types(config)):
        p = f"model.layers.{i}."
        mixer: Mixer = (kda(config, weights, p + "self_attn.", dtype) if kind == "linear_attention"
                        else HeadGatedMLA(config, weights, p + "self_attn.", rope, dtype))
        ffn: FFN = (SigmoidMoE(config, weights, i, p + "mlp.", executor, DEFAULTS) if i in config.moe_layers
                    else dense_mlp(weights, p + "mlp."))
        blocks.append(Block(weights.get(p + "input_layernorm.weight"), mixer,
                            weights.get(p + "post_attention_layernorm.weight"), ffn))
    return DecoderModel(config, weights, blocks, dtype)
