"""JetBrains Mellum 2 (mellum): Qwen3-MoE's block (GQA with per-head q/k RMSNorms before RoPE,
softmax top-k routing, renormalized where `norm_topk_prob`; qwen3_moe.py) in two kinds of layer,
as `layer_types` says: sliding ones attend within `sliding_window` positions, full ones to
everything, each kind with its own RoPE (`rope_parameters` keyed by layer type: base and scaling; always
the whole head, as transformers rotates it). A dense SwiGLU MLP where `mlp_layer_types` says "dense".
The multi-token-prediction layer (`mtp.`) is dropped at conversion."""

from __future__ import annotations

import torch

from ..config import ModelConfig, UnsupportedFamilyError
from ..experts import ExpertExecutor
from ..layers.rope import ropes_by_layer_type
from ..loading.read_ftw import ModelWeights
from .base import FFN, Block, DecoderModel
from .layer_schedule import layer_types as checked_layer_types
from .qwen3_moe import GQAAttention, SoftmaxMoE, dense_mlp

# MellumConfig's defaults, for a config.json that leaves a key out
DEFAULTS = dict(sliding_window=1024, norm_topk_prob=True)
ROPE_DEFAULTS = {"full_attention": {"rope_type": "default", "rope_theta": 500000.0},
                 "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}


def layer_types(config: ModelConfig) -> list[str]:
    """`layer_types`, else every layer full (MellumConfig's default)."""
    return checked_layer_types(config, "mellum", lambda i: "full_attention", kinds=ROPE_DEFAULTS)


def build(config: ModelConfig, weights: ModelWeights, executor: ExpertExecutor, dtype: torch.dtype) -> DecoderModel:
    if config.get("hidden_act", "silu") != "silu":
        raise UnsupportedFamilyError("mellum with another hidden_act than silu is not supported")
    window = config.source.get("sliding_window", DEFAULTS["sliding_window"])  # (null: none, as transformers reads it)
    window = None if window is None else int(window)
    normalize = bool(config.get("norm_topk_prob", DEFAULTS["norm_topk_prob"]))
    types = layer_types(config)
    ropes = ropes_by_layer_type(config, types, ROPE_DEFAULTS, "mellum")
    if any(rope.rotary_dim != config.head_dim for rope in ropes.values()):  # (transformers' Mellum crashes on it)
        raise UnsupportedFamilyError("mellum with a partial_rotary_factor below 1 is not supported")
    blocks = []
    for i, kind in enumerate(types):
        p = f"model.layers.{i}."
        attention = GQAAttention(config, weights, p + "self_attn.", ropes[kind], dtype, qk_norm=True,
                                 window=window if kind == "sliding_attention" else None)
        ffn: FFN = (SoftmaxMoE(config, weights, i, p + "mlp.gate.weight", executor, normalize=normalize)
                    if i in config.moe_layers else dense_mlp(weights, p + "mlp."))
        blocks.append(Block(weights.get(p + "input_layernorm.weight"), attention,
                            weights.get(p + "post_attention_layernorm.weight"), ffn))
    return DecoderModel(config, weights, blocks, dtype)
