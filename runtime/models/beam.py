"""Reflection AI Beam (beam): Qwen3-MoE's attention (GQA, per-head q/k RMSNorms) in two kinds of
layer as `layer_types` says (BeamConfig's: every sixth and the last full, the rest sliding), with
`rope_parameters` keyed by layer type: a type with parameters rotates (RoPE; BeamConfig's sliding
layers), a type with None has no position encoding (NoPE; its full layers) and scales its queries
by scalable-softmax's (1 + (p + 1) / 2048) ** 0.1 (layers/rope.log_length_query_scale). Sliding
layers attend within `sliding_window` positions. The attended values are gated per channel by
sigmoid(gate_proj x + gate_bias), the bias one a head, before o_proj.

Sandwich norms (post_attention_layernorm on the attention's output, pre/post_feedforward_layernorm
around the MLP) and a depth-scaled residual: the n-th join (2 (layer + 1) for the attention, one
more for the MLP) gives x * sqrt((n - 1) / n) + out / sqrt(n) (base.Block's `scales`).

Dense SwiGLU MLPs where `mlp_layer_types` says "dense" (BeamConfig's: the first three), elsewhere
DeepSeek-V3's routing without shared experts (sigmoid + correction bias, group-limited top-k,
renormalized) whose `routed_scaling_factor` multiplies the experts' sum (deepseek_v3.SigmoidMoE's
scale_after_sum). Logits soft-capped at `final_logit_softcapping` (30). Beam's RMSNorms multiply by
their weight before the cast back (Olmo 3's), its SwiGLUs compute in float32: the same in float32,
a rounding apart in 16 bits.
"""

from __future__ import annotations

import math

import torch

from ..config import ModelConfig, UnsupportedFamilyError
from ..experts import ExpertExecutor
from ..layers.attention import KVCache, Start
from ..layers.linear import linear
from ..layers.rope import RotaryEmbedding, apply_rotary, log_length_query_scale
from ..loading.read_ftw import ModelWeights
from .base import FFN, Block, DecoderModel
from .deepseek_v3 import SigmoidMoE
from .flex_olmo import PostNormedMixer, post_normed
from .layer_schedule import layer_types as checked_layer_types
from .qwen3_moe import GQAAttention, dense_mlp

# BeamConfig's defaults, for a config.json that leaves a key out
DEFAULTS = dict(n_group=8, topk_group=4, norm_topk_prob=True, routed_scaling_factor=2.5, n_shared_experts=0,
                sliding_window=512, final_logit_softcapping=30.0)
ROPE_DEFAULTS = {"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}, "full_attention": None}

# transformers keeps these in float32 (_keep_in_fp32_modules_strict): routing must not see bf16-rounded values
KEEP_FLOAT32 = ("e_score_correction_bias", "mlp.gate.weight")


class HeadBiasedGatedAttention(GQAAttention):
    """Attention with per-head q/k RMSNorms, rotated (`rotate`) or NoPE with the log-length query
    scale, within `window` positions or over every earlier one (None); the attended values times
    sigmoid(gate_proj x + gate_bias) before o_proj, the bias [Hq] one a head, over its channels."""

    def __init__(self, config: ModelConfig, weights: ModelWeights, prefix: str, rope: RotaryEmbedding,
                 dtype: torch.dtype, *, rotate: bool, window: int | None) -> None:
        super().__init__(config, weights, prefix, rope, dtype, qk_norm=True, rotary=apply_rotary if rotate else None,
                         window=window, query_scale=None if rotate else log_length_query_scale)
        self.gate, self.gate_bias = weights.get(prefix + "gate_proj.weight"), weights.get(prefix + "gate_bias")

    def __call__(self, x: torch.Tensor, positions: torch.Tensor, cache: KVCache, start: Start) -> torch.Tensor:
        t = x.shape[0]
        out = self.attend(x, positions, cache, start).view(t, self.heads, self.head_dim)  # [T, Hq, D]
        gate = linear(x, self.gate).view(t, self.heads, self.head_dim) + self.gate_bias.to(x.dtype)[:, None]
        return linear((out * torch.sigmoid(gate)).reshape(t, -1), self.o, self.o_bias)


def layer_types(config: ModelConfig) -> list[str]:
    """`layer_types`, else BeamConfig's schedule: every sixth layer and the last full, the rest sliding."""
    last = config.num_layers - 1
    return checked_layer_types(config, "beam", lambda i: (
        "full_attention" if (i + 1) % 6 == 0 or i == last else "sliding_attention"))


def ropes(config: ModelConfig, types: list[str]) -> dict[str, RotaryEmbedding | None]:
    """Each layer type's RoPE, None for a NoPE type (its rope_parameters entry null)."""
    params = config.get("rope_parameters", ROPE_DEFAULTS)
    if not isinstance(params, dict) or not set(types) <= set(params) <= set(ROPE_DEFAULTS):
        raise UnsupportedFamilyError("beam needs rope_parameters keyed by layer type (sliding_attention, "
                                     f"full_attention; null for NoPE), as transformers reads them; the config has "
                                     f"{str(params)[:80]}")
    out: dict[str, RotaryEmbedding | None] = {}
    for kind, p in params.items():
        if p is not None and float(p.get("partial_rotary_factor", 1.0)) != 1.0:  # (transformers' Beam rotates whole heads)
            raise UnsupportedFamilyError("beam with a partial_rotary_factor below 1 is not supported")
        out[kind] = None if p is None else RotaryEmbedding(config.head_dim, {"rope_type": "default", **p},
                                                           config.context_length)
    return out


def build(config: ModelConfig, weights: ModelWeights, executor: ExpertExecutor, dtype: torch.dtype) -> DecoderModel:
    if config.get("hidden_act", "silu") != "silu":
        raise UnsupportedFamilyError("beam with another hidden_act than silu is not supported")
    if config.get("attention_bias", False):  # (BeamAttention's gate has no such bias; the q/k/v/o ones alone are untested)
        raise UnsupportedFamilyError("beam with attention_bias is not supported")
    if config.source.get("n_group", 1) is None or config.source.get("topk_group", 1) is None:
        raise UnsupportedFamilyError("beam without n_group or topk_group is not supported (transformers 5.25's "
                                     "router cannot run one either)")
    types = layer_types(config)
    window = config.source.get("sliding_window", DEFAULTS["sliding_window"])
    if "sliding_attention" in types and not window:  # (transformers' mask maker raises on it)
        raise UnsupportedFamilyError("beam with sliding_attention layers but no sliding_window is not supported")
    by_type = ropes(config, types)
    softcap = config.source.get("final_logit_softcapping", DEFAULTS["final_logit_softcapping"])
    eps = config.rms_norm_eps
    unread = RotaryEmbedding(config.head_dim, {"rope_type": "default"}, config.context_length)  # (a NoPE layer's)
    blocks = []
    for i, kind in enumerate(types):
        p, rope = f"model.layers.{i}.", by_type[kind]
        attention = HeadBiasedGatedAttention(config, weights, p + "self_attn.", rope or unread, dtype,
                                             rotate=rope is not None,
                                             window=int(window) if kind == "sliding_attention" else None)
        ffn: FFN = (SigmoidMoE(config, weights, i, p + "mlp.", executor, DEFAULTS, scale_after_sum=True)
                    if i in config.moe_layers else dense_mlp(weights, p + "mlp."))
        joins = 2 * (i + 1), 2 * (i + 1) + 1  # (the attention's and the MLP's, counted from 2 over the model)
        blocks.append(Block(weights.get(p + "input_layernorm.weight"),
                            PostNormedMixer(attention, weights.get(p + "post_attention_layernorm.weight"), eps),
                            weights.get(p + "pre_feedforward_layernorm.weight"),
                            post_normed(ffn, weights.get(p + "post_feedforward_layernorm.weight"), eps),
                            scales=tuple((math.sqrt((n - 1) / n), 1 / math.sqrt(n)) for n in joins)))  # type: ignore[arg-type]
    return DecoderModel(config, weights, blocks, dtype, final_logit_softcapping=softcap)
