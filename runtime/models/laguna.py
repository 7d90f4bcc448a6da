"""Poolside Laguna (laguna): GQA attention with per-head q/k RMSNorms, RoPE on the first
`partial_rotary_factor` of each head (rope_parameters keyed by layer type, each kind its own base
and factor), a softplus output gate (`g_proj`: one value a head, or a channel where `gating` is
"per-element") and its own query-head count on each layer (`num_attention_heads_per_layer`);
sliding layers attend within `sliding_window` positions, full ones to everything. Dense SwiGLU
MLPs where `mlp_layer_types` says "dense", elsewhere a MoE: sigmoid scores of the router's logits
(soft-capped by tanh where `moe_router_logit_softcapping`), the choice by score + the correction
bias, weights renormalized; the routed sum times `moe_routed_scaling_factor`, shared experts added."""

from __future__ import annotations

from dataclasses import replace

import torch
import torch.nn.functional as F

from ..config import ModelConfig, UnsupportedFamilyError
from ..experts import ExpertExecutor
from ..layers.attention import KVCache, Start
from ..layers.linear import linear
from ..layers.rope import RotaryEmbedding, ropes_by_layer_type
from ..loading.read_ftw import ModelWeights
from .base import FFN, Block, DecoderModel
from .qwen3_moe import GQAAttention, dense_mlp

# LagunaConfig's defaults, for checkpoints whose config.json leaves a key out
DEFAULTS = dict(sliding_window=512, gating=True, moe_routed_scaling_factor=1.0, moe_router_logit_softcapping=0.0)
ROPE_DEFAULTS = {"full_attention": {"rope_type": "default", "rope_theta": 500000.0, "partial_rotary_factor": 0.5},
                 "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 1.0}}


class GatedAttention(GQAAttention):
    """Attention with per-head q/k RMSNorms before (partial) RoPE, within `window` positions or
    over every earlier one (None), its output times softplus(g_proj x), per head or per channel."""

    def __init__(self, config: ModelConfig, weights: ModelWeights, prefix: str, rope: RotaryEmbedding,
                 dtype: torch.dtype, *, window: int | None, per_head: bool) -> None:
        super().__init__(config, weights, prefix, rope, dtype, qk_norm=True, window=window)
        self.per_head, self.gate = per_head, weights.get(prefix + "g_proj.weight")

    def __call__(self, x: torch.Tensor, positions: torch.Tensor, cache: KVCache, start: Start) -> torch.Tensor:
        t = x.shape[0]
        out = self.attend(x, positions, cache, start)  # [T, Hq * D]
        gate = F.softplus(linear(x, self.gate).to(torch.float32)).to(out.dtype)  # [T, Hq] or [T, Hq * D]
        out = out.view(t, self.heads, self.head_dim) * gate[:, :, None] if self.per_head else out * gate
        return linear(out.reshape(t, self.heads * self.head_dim), self.o, self.o_bias)


class LagunaMoE:
    """Router (sigmoid of the soft-capped logits in float32, the top k by score + correction bias,
    renormalized) + routed experts through the executor, times the routed scale, + shared experts."""

    def __init__(self, config: ModelConfig, weights: ModelWeights, layer: int, prefix: str,
                 executor: ExpertExecutor) -> None:
        self.router, self.bias = weights.get(prefix + "gate.weight"), weights.get(prefix + "gate.e_score_correction_bias")
        self.shared = dense_mlp(weights, prefix + "shared_experts.")
        self.layer, self.executor, self.k = layer, executor, config.num_experts_per_tok
        self.cap = float(config.get("moe_router_logit_softcapping", DEFAULTS["moe_router_logit_softcapping"]))
        self.scaling = float(config.get("moe_routed_scaling_factor", DEFAULTS["moe_routed_scaling_factor"]))

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        logits = linear(x, self.router).to(torch.float32)
        if self.cap > 0.0:
            logits = torch.tanh(logits / self.cap) * self.cap
        scores = torch.sigmoid(logits)
        ids = torch.topk(scores + self.bias.to(torch.float32), self.k, dim=-1).indices
        weights = scores.gather(-1, ids)
        weights = weights / weights.sum(dim=-1, keepdim=True)
        routed = self.executor(self.layer, x, ids, weights.to(x.dtype))
        return routed * self.scaling + self.shared(x)


def per_layer(config: ModelConfig) -> tuple[list[str], list[int]]:
    """(`layer_types`, default all full; `num_attention_heads_per_layer`, default num_attention_heads)."""
    n = config.num_layers
    types = config.get("layer_types") or ["full_attention"] * n
    heads = config.get("num_attention_heads_per_layer") or [config.num_attention_heads] * n
    if len(types) != n or set(types) - {"sliding_attention", "full_attention"} or len(heads) != n:
        raise UnsupportedFamilyError(f"unsupported laguna layer_types {types!r} or heads per layer {heads!r} "
                                     f"for {n} layers")
    return list(types), [int(h) for h in heads]


def build(config: ModelConfig, weights: ModelWeights, executor: ExpertExecutor, dtype: torch.dtype) -> DecoderModel:
    if config.get("hidden_act", "silu") != "silu" or config.get("moe_apply_router_weight_on_input", False):
        raise UnsupportedFamilyError("laguna with another hidden_act than silu, or router weights on the experts' "
                                     "input, is not supported (transformers runs neither)")
    gating = config.source.get("gating", DEFAULTS["gating"])
    if gating not in (True, "per-head", "per-element"):
        raise UnsupportedFamilyError(f"laguna with gating {gating!r} is not supported")
    window = int(config.get("sliding_window", DEFAULTS["sliding_window"]))
    types, heads = per_layer(config)
    ropes = ropes_by_layer_type(config, types, ROPE_DEFAULTS, "laguna")
    blocks = []
    for i, (kind, layer_heads) in enumerate(zip(types, heads, strict=True)):
        p = f"model.layers.{i}."
        attention = GatedAttention(replace(config, num_attention_heads=layer_heads), weights, p + "self_attn.",
                                   ropes[kind], dtype, window=window if kind == "sliding_attention" else None,
                                   per_head=gating != "per-element")
        ffn: FFN = LagunaMoE(config, weights, i, p + "mlp.", executor) if i in config.moe_layers else (
            dense_mlp(weights, p + "mlp."))
        blocks.append(Block(weights.get(p + "input_layernorm.weight"), attention,
                            weights.get(p + "post_attention_layernorm.weight"), ffn))
    return DecoderModel(config, weights, blocks, dtype)
