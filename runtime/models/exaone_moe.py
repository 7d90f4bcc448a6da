"""K-EXAONE (exaone_moe): Qwen3's GQA attention (per-head q/k RMSNorms before RoPE) in two kinds
of layer, as `layer_types` says: local ones attend within a sliding window of `sliding_window`
positions with RoPE, global ones attend to everything with no position encoding at all (NoPE).
A dense SwiGLU MLP on the layers `mlp_layer_types` marks dense, DeepSeek-V3's MoE on the
others (deepseek_v3.py: sigmoid scores, the correction bias for the choice, group-limited top-k,
shared experts), its bias stored beside the router. The multi-token-prediction weights (`mtp.`)
are dropped at conversion."""

from __future__ import annotations

import torch

from ..config import ModelConfig, UnsupportedFamilyError
from ..experts import ExpertExecutor
from ..layers.rope import RotaryEmbedding, apply_rotary
from ..loading.read_ftw import ModelWeights
from .base import FFN, Block, DecoderModel
from .deepseek_v3 import SigmoidMoE
from .qwen3_moe import GQAAttention, dense_mlp

# ExaoneMoeConfig's defaults, for checkpoints whose config.json leaves a key out
DEFAULTS = dict(sliding_window=4096, sliding_window_pattern=4, num_shared_experts=1, n_group=1, topk_group=1,
                norm_topk_prob=True, routed_scaling_factor=2.5)

# transformers keeps these in float32 (_keep_in_fp32_modules_strict): routing must not see bf16-rounded values
KEEP_FLOAT32 = ("e_score_correction_bias", "mlp.gate.weight")


def local_global_attention(config: ModelConfig, weights: ModelWeights, prefix: str, rope: RotaryEmbedding,
                           dtype: torch.dtype, *, window: int | None) -> GQAAttention:
    """Attention with per-head q/k RMSNorms; a local layer (`window` positions) rotates queries and
    keys and attends within its window, a global one (`window` None) neither (NoPE)."""
    return GQAAttention(config, weights, prefix, rope, dtype, qk_norm=True, window=window,
                        rotary=apply_rotary if window is not None else None)


def layer_types(config: ModelConfig) -> list[str]:
    """`layer_types`, else ExaoneMoeConfig's schedule: every `sliding_window_pattern`-th layer
    global, the others local."""
    types = config.get("layer_types")
    if types is None:
        pattern = config.get("sliding_window_pattern", DEFAULTS["sliding_window_pattern"])
        if isinstance(pattern, int) and not isinstance(pattern, bool) and pattern > 0:
            types = ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(config.num_layers)]
        else:
            raise UnsupportedFamilyError(f"EXAONE with sliding_window_pattern {pattern!r} and no layer_types is not "
                                         "supported (transformers reads a whole number there)")
    if len(types) != config.num_layers or set(types) - {"sliding_attention", "full_attention"}:
        raise UnsupportedFamilyError(f"unsupported EXAONE layer_types {types!r} for {config.num_layers} layers")
    return list(types)


def build(config: ModelConfig, weights: ModelWeights, executor: ExpertExecutor, dtype: torch.dtype) -> DecoderModel:
    window = int(config.get("sliding_window", DEFAULTS["sliding_window"]))  # (transformers takes no null here)
    rope = RotaryEmbedding(config.head_dim, config.rope_parameters, config.context_length)
    # DeepseekV3's keys for SigmoidMoE: EXAONE names its shared experts' count num_shared_experts
    defaults = {**DEFAULTS, "n_shared_experts": int(config.get("num_shared_experts", DEFAULTS["num_shared_experts"]))}
    blocks = []
    for i, kind in enumerate(layer_types(config)):
        p = f"model.layers.{i}."
        attention = local_global_attention(config, weights, p + "self_attn.", rope, dtype,
                                           window=window if kind == "sliding_attention" else None)
        # the bias beside the router as released, in it where transformers >= 5 saves its own layout
        bias = "e_score_correction_bias" if weights.maybe(p + "mlp.e_score_correction_bias") is not None else (
            "gate.e_score_correction_bias")
        ffn: FFN = (SigmoidMoE(config, weights, i, p + "mlp.", executor, defaults, bias=bias)
                    if i in config.moe_layers else dense_mlp(weights, p + "mlp."))
        blocks.append(Block(weights.get(p + "input_layernorm.weight"), attention,
                            weights.get(p + "post_attention_layernorm.weight"), ffn))
    return DecoderModel(config, weights, blocks, dtype)
