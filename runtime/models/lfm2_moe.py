"""LFM2-MoE (lfm2_moe, Liquid AI): a hybrid of gated short-convolution layers (layers/short_conv.py)
and GQA attention layers (per-head q/k RMSNorms before RoPE, `out_proj`), as `layer_types` says
("conv" or "full_attention"). The first `num_dense_layers` run a SwiGLU MLP (w1 gate, w3 up, w2
down), the rest a MoE: sigmoid scores, the choice by score + `expert_bias` (where
`use_expert_bias`), weights renormalized where `norm_topk_prob` and times
`routed_scaling_factor`. The final norm is `embedding_norm`; norms use `norm_eps`; the head is
tied to the embeddings by default."""

from __future__ import annotations

import torch

from ..config import ModelConfig, UnsupportedFamilyError
from ..experts import ExpertExecutor
from ..layers.linear import linear
from ..layers.mlp import swiglu_mlp
from ..layers.rope import RotaryEmbedding
from ..layers.short_conv import ShortConv
from ..loading.read_ftw import ModelWeights
from .base import FFN, Block, DecoderModel, Mixer
from .qwen3_moe import GQAAttention

# Lfm2MoeConfig's defaults, for checkpoints whose config.json leaves a key out
DEFAULTS = dict(use_expert_bias=True, norm_topk_prob=True, routed_scaling_factor=1.0, rope_theta=1_000_000.0)

# the expert bias steers the choice: kept as stored (float32), not rounded to the compute dtype
KEEP_FLOAT32 = ("feed_forward.expert_bias",)


def lfm2_attention(config: ModelConfig, weights: ModelWeights, prefix: str, rope: RotaryEmbedding,
                   dtype: torch.dtype) -> GQAAttention:
    """GQAAttention under LFM2's names: q/k norms `q_layernorm`/`k_layernorm`, output `out_proj`."""
    return GQAAttention(config, weights, prefix, rope, dtype, qk_norm=True,
                        norm_names=("q_layernorm", "k_layernorm"), out_name="out_proj")


class Lfm2MoE:
    """Router (sigmoid scores, the top k by score + `expert_bias`, renormalized with an eps of
    1e-6, times `routed_scaling_factor`) + routed experts through the executor."""

    def __init__(self, config: ModelConfig, weights: ModelWeights, layer: int, prefix: str,
                 executor: ExpertExecutor) -> None:
        def get(key: str):
            return config.get(key, DEFAULTS[key])

        self.router = weights.get(prefix + "gate.weight")
        self.bias = weights.get(prefix + "expert_bias") if get("use_expert_bias") else None
        self.layer, self.executor, self.k = layer, executor, config.num_experts_per_tok
        self.normalize, self.scaling = bool(get("norm_topk_prob")), float(get("routed_scaling_factor"))

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        scores = torch.sigmoid(linear(x, self.router))
        if self.bias is None:
            weights, ids = torch.topk(scores, self.k, dim=-1)
        else:
            ids = torch.topk(scores + self.bias, self.k, dim=-1).indices
            weights = scores.gather(1, ids)
        if self.normalize:
            weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-6)
        weights = weights * self.scaling
        return self.executor(self.layer, x, ids, weights.to(x.dtype))


def dense_mlp(weights: ModelWeights, prefix: str) -> FFN:
    gate, up, down = (weights.get(f"{prefix}{p}.weight") for p in ("w1", "w3", "w2"))
    return lambda x: swiglu_mlp(x, gate, up, down)


def build(config: ModelConfig, weights: ModelWeights, executor: ExpertExecutor, dtype: torch.dtype) -> DecoderModel:
    types = config.get("layer_types")
    if not isinstance(types, list) or len(types) != config.num_layers or set(types) - {"conv", "full_attention"}:
        raise UnsupportedFamilyError(f"lfm2_moe needs layer_types, one of conv or full_attention a layer "
                                     f"({config.num_layers}); the config has {str(types)[:80]}")
    params = config.rope_parameters
    if config.get("rope_theta") is None and "rope_theta" not in (config.get("rope_parameters") or {}):
        params["rope_theta"] = DEFAULTS["rope_theta"]
    rope = RotaryEmbedding(config.head_dim, params, config.context_length)
    blocks = []
    for i, kind in enumerate(types):
        p = f"model.layers.{i}."
        mixer: Mixer = (ShortConv(weights, p + "conv.", dtype) if kind == "conv"
                        else lfm2_attention(config, weights, p + "self_attn.", rope, dtype))
        ffn: FFN = Lfm2MoE(config, weights, i, p + "feed_forward.", executor) if i in config.moe_layers else (
            dense_mlp(weights, p + "feed_forward."))
        blocks.append(Block(weights.get(p + "operator_norm.weight"), mixer, weights.get(p + "ffn_norm.weight"), ffn))
    return DecoderModel(config, weights, blocks, dtype, final_norm=weights.get("model.embedding_norm.weight"))
