"""Aleph Alpha Kolibri 1 (kolibri1): GQA with per-head q/k RMSNorms (qwen3_moe.GQAAttention) in two
kinds of layer as `layer_types` says (Kolibri1Config's: every fifth layer full, the rest sliding):
sliding ones rotate (RoPE) and attend within `sliding_window` positions, full ones attend to
everything without position encoding (NoPE). Sandwich norms: the attention's and the MoE's outputs are RMSNormed
(`post_self_attn_layernorm`, `post_mlp_layernorm`) before each joins the residual
(flex_olmo.PostNormedMixer, post_normed), beside the usual pre-norms.

Every layer is a MoE: float32 router logits, the top k chosen by logit + `e_score_correction_bias`
and weighed by the sigmoid of their logits (layers/mlp.logit_biased_sigmoid_topk), renormalized
only where `norm_topk_prob` (Kolibri1Config's default: not), plus shared experts as one SwiGLU
MLP `shared_expert_intermediate_size` wide. The release's names (`moe.router.expert_bias`,
`post_attn_norm`, `post_ffn_norm`) are renamed to transformers' at conversion (ftw/families.py).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..config import ModelConfig, UnsupportedFamilyError
from ..experts import ExpertExecutor
from ..layers.mlp import logit_biased_sigmoid_topk
from ..layers.rope import apply_rotary, whole_head_rope
from ..loading.read_ftw import ModelWeights
from .base import Block, DecoderModel
from .flex_olmo import PostNormedMixer, post_normed
from .layer_schedule import layer_types as checked_layer_types
from .qwen3_moe import GQAAttention, dense_mlp

# Kolibri1Config's defaults, for a config.json that leaves a key out
DEFAULTS = dict(sliding_window=513, norm_topk_prob=False)

# transformers keeps the correction bias in float32 (_keep_in_fp32_modules_strict)
KEEP_FLOAT32 = ("e_score_correction_bias",)


class LogitBiasedMoE:
    """Router (float32 logits; the top k by logit + bias, weighed by their sigmoid) + routed experts
    through the executor + the shared experts' MLP added to the routed output."""

    def __init__(self, config: ModelConfig, weights: ModelWeights, layer: int, prefix: str,
                 executor: ExpertExecutor, *, normalize: bool) -> None:
        self.router, self.bias = weights.get(prefix + "gate.weight"), weights.get(prefix + "gate.e_score_correction_bias")
        self.shared = dense_mlp(weights, prefix + "shared_experts.")
        self.layer, self.executor, self.k, self.normalize = layer, executor, config.num_experts_per_tok, normalize

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        logits = F.linear(x.to(torch.float32), self.router.to(torch.float32))
        ids, weights = logit_biased_sigmoid_topk(logits, self.bias, self.k, self.normalize)
        return self.executor(self.layer, x, ids, weights.to(x.dtype)) + self.shared(x)


def layer_types(config: ModelConfig) -> list[str]:
    """`layer_types`, else Kolibri1Config's schedule: every fifth layer full, the rest sliding."""
    return checked_layer_types(config, "kolibri1", lambda i: "full_attention" if (i + 1) % 5 == 0 else "sliding_attention")


def build(config: ModelConfig, weights: ModelWeights, executor: ExpertExecutor, dtype: torch.dtype) -> DecoderModel:
    if config.get("hidden_act", "silu") != "silu":
        raise UnsupportedFamilyError("kolibri1 with another hidden_act than silu is not supported")
    types = layer_types(config)
    window = config.source.get("sliding_window", DEFAULTS["sliding_window"])
    if not window:  # (transformers' attention would rotate every layer then, but its mask maker raises on it)
        raise UnsupportedFamilyError("kolibri1 without a positive sliding_window is not supported (transformers 5.25 "
                                     "cannot run one either)")
    rope = whole_head_rope(config, "kolibri1")
    normalize, eps = bool(config.get("norm_topk_prob", DEFAULTS["norm_topk_prob"])), config.rms_norm_eps
    blocks = []
    for i, kind in enumerate(types):
        p = f"model.layers.{i}."
        sliding = kind == "sliding_attention"
        attention = GQAAttention(config, weights, p + "self_attn.", rope, dtype, qk_norm=True,
                                 rotary=apply_rotary if sliding else None,
                                 window=int(window) if sliding else None)
        moe = LogitBiasedMoE(config, weights, i, p + "mlp.", executor, normalize=normalize)
        blocks.append(Block(weights.get(p + "input_layernorm.weight"),
                            PostNormedMixer(attention, weights.get(p + "post_self_attn_layernorm.weight"), eps),
                            weights.get(p + "post_attention_layernorm.weight"),
                            post_normed(moe, weights.get(p + "post_mlp_layernorm.weight"), eps)))
    return DecoderModel(config, weights, blocks, dtype)
