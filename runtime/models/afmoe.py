"""Arcee Trinity (afmoe): GQA attention with per-head q/k RMSNorms and a sigmoid output gate
(`gate_proj`, one value a channel), in two kinds of layer as `layer_types` says: sliding ones
rotate queries and keys and attend within `sliding_window` positions, full ones (every
`global_attn_every_n_layers`-th) attend to everything with no position encoding. Each sublayer
is normed before and after (`input_layernorm` and `post_attention_layernorm` around attention,
`pre_mlp_layernorm` and `post_mlp_layernorm` around the MLP). The first `num_dense_layers` run a
SwiGLU MLP, the rest a MoE: sigmoid scores, the choice by score + `expert_bias`, weights
renormalized and times `route_scale`, shared experts added. Embeddings times sqrt(hidden_size)
where `mup_enabled`."""

from __future__ import annotations

import math

import torch

from ..config import ModelConfig, UnsupportedFamilyError
from ..experts import ExpertExecutor
from ..layers.attention import KVCache, Start
from ..layers.linear import linear
from ..layers.mlp import biased_topk
from ..layers.rope import RotaryEmbedding, apply_rotary
from ..loading.read_ftw import ModelWeights
from .base import FFN, Block, DecoderModel
from .flex_olmo import PostNormedMixer, post_normed
from .layer_schedule import layer_types as checked_layer_types
from .qwen3_moe import GQAAttention, dense_mlp

# AfmoeConfig's defaults, for checkpoints whose config.json leaves a key out
DEFAULTS = dict(sliding_window=1024, global_attn_every_n_layers=4, num_shared_experts=2, route_scale=1.0)

# transformers keeps these in float32 (_keep_in_fp32_modules_strict): routing must not see bf16-rounded values
KEEP_FLOAT32 = ("mlp.expert_bias",)


class GatedLocalGlobalAttention(GQAAttention):
    """EXAONE's attention (per-head q/k RMSNorms before RoPE; a local layer rotates and attends
    within its window, a global one neither), its output gated channel by channel by
    sigmoid(gate_proj x) before o_proj."""

    def __init__(self, config: ModelConfig, weights: ModelWeights, prefix: str, rope: RotaryEmbedding,
                 dtype: torch.dtype, *, window: int | None) -> None:
        super().__init__(config, weights, prefix, rope, dtype, qk_norm=True, window=window,
                         rotary=apply_rotary if window is not None else None)
        self.gate = weights.get(prefix + "gate_proj.weight")

    def __call__(self, x: torch.Tensor, positions: torch.Tensor, cache: KVCache, start: Start) -> torch.Tensor:
        gated = self.attend(x, positions, cache, start) * torch.sigmoid(linear(x, self.gate))
        return linear(gated, self.o, self.o_bias)


class BiasedSigmoidMoE:
    """Router (`router.gate`: sigmoid scores in float32, the top k by score + `expert_bias`,
    renormalized, times `route_scale`) + routed experts through the executor + shared experts."""

    def __init__(self, config: ModelConfig, weights: ModelWeights, layer: int, prefix: str,
                 executor: ExpertExecutor) -> None:
        self.router, self.bias = weights.get(prefix + "router.gate.weight"), weights.get(prefix + "expert_bias")
        shared = int(config.get("num_shared_experts", DEFAULTS["num_shared_experts"]))
        self.shared = dense_mlp(weights, prefix + "shared_experts.") if shared > 0 else None
        self.layer, self.executor, self.k = layer, executor, config.num_experts_per_tok
        self.scaling = float(config.get("route_scale", DEFAULTS["route_scale"]))

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        scores = torch.sigmoid(linear(x, self.router).to(torch.float32))
        ids, weights = biased_topk(scores, self.bias.to(torch.float32), self.k, self.scaling)
        routed = self.executor(self.layer, x, ids, weights.to(x.dtype))
        return routed if self.shared is None else self.shared(x) + routed


def layer_types(config: ModelConfig) -> list[str]:
    """`layer_types`, else AfmoeConfig's schedule: every `global_attn_every_n_layers`-th layer full."""
    every = int(config.get("global_attn_every_n_layers", DEFAULTS["global_attn_every_n_layers"]))
    return checked_layer_types(config, "afmoe", lambda i: "sliding_attention" if (i + 1) % every else "full_attention")


def build(config: ModelConfig, weights: ModelWeights, executor: ExpertExecutor, dtype: torch.dtype) -> DecoderModel:
    if config.get("hidden_act", "silu") != "silu":
        raise UnsupportedFamilyError(f"afmoe with hidden_act {config.get('hidden_act')!r} is not supported "
                                     "(the expert kernels compute SiLU)")
    window = int(config.get("sliding_window", DEFAULTS["sliding_window"]))
    rope, eps = RotaryEmbedding(config.head_dim, config.rope_parameters, config.context_length), config.rms_norm_eps
    blocks = []
    for i, kind in enumerate(layer_types(config)):
        p = f"model.layers.{i}."
        attention = GatedLocalGlobalAttention(config, weights, p + "self_attn.", rope, dtype,
                                              window=window if kind == "sliding_attention" else None)
        ffn: FFN = BiasedSigmoidMoE(config, weights, i, p + "mlp.", executor) if i in config.moe_layers else (
            dense_mlp(weights, p + "mlp."))
        blocks.append(Block(weights.get(p + "input_layernorm.weight"),
                            PostNormedMixer(attention, weights.get(p + "post_attention_layernorm.weight"), eps),
                            weights.get(p + "pre_mlp_layernorm.weight"),
                            post_normed(ffn, weights.get(p + "post_mlp_layernorm.weight"), eps)))
    multiplier = math.sqrt(config.hidden_size) if config.get("mup_enabled", False) else 1.0
    return DecoderModel(config, weights, blocks, dtype, embedding_multiplier=multiplier)
