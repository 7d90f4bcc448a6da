"""IBM Granite MoE with sliding-window attention (granitemoe_swa): granitemoeshared's block
(granitemoe.py: Granite's embedding, attention, residual and logits multipliers; every layer a
softmax top-k MoE, with a shared MLP where `shared_intermediate_size` is above 0) under GraniteSWA's
attention: a learned sink logit per head on every layer (layers/sink_attention.py), sliding layers
attending within `sliding_window` positions and full ones to everything as `layer_types` says, and
each layer's own RoPE base from `layer_rope_theta`, where 0 means no position encoding (NoPE).

Experts and router under Granite's names or transformers' (`block_sparse_moe.input_linear` or
`experts.gate_up_proj`; `router.layer.weight` or `router.weight`), as granitemoe reads them.
"""

from __future__ import annotations

from typing import Any

import torch

from ..config import ModelConfig, UnsupportedFamilyError
from ..experts import ExpertExecutor
from ..layers.rope import RotaryEmbedding, apply_rotary
from ..loading.read_ftw import ModelWeights
from .base import Block, DecoderModel
from .granitemoe import DEFAULTS, GraniteMoE
from .layer_schedule import layer_types as checked_layer_types
from .qwen3_moe import GQAAttention

SLIDING_WINDOW = 128  # GraniteMoeSWAConfig's default


def layer_types(config: ModelConfig) -> list[str]:
    """`layer_types`, else GraniteMoeSWAConfig's schedule: every fourth layer full from layer 0, the rest sliding."""
    return checked_layer_types(config, "granitemoe_swa", lambda i: "full_attention" if i % 4 == 0 else "sliding_attention")


def layer_rope_theta(config: ModelConfig, params: dict[str, Any]) -> list[float]:
    """Each layer's RoPE base: `layer_rope_theta` (0: NoPE), else the global one on every layer."""
    thetas = config.get("layer_rope_theta") or [params["rope_theta"]] * config.num_layers
    if len(thetas) != config.num_layers or any(not isinstance(t, (int, float)) or t < 0 for t in thetas):
        raise UnsupportedFamilyError(f"unsupported granitemoe_swa layer_rope_theta {thetas!r} for "
                                     f"{config.num_layers} layers")
    return [float(t) for t in thetas]


def build(config: ModelConfig, weights: ModelWeights, executor: ExpertExecutor, dtype: torch.dtype) -> DecoderModel:
    if config.get("hidden_act", "silu") != "silu":
        raise UnsupportedFamilyError(f"Granite MoE with hidden_act {config.get('hidden_act')!r} is not supported "
                                     "(the expert kernels compute SiLU)")

    def get(key: str) -> float:
        return float(config.get(key, DEFAULTS[key]))

    window = config.source.get("sliding_window", SLIDING_WINDOW)  # (null: the sliding layers see all)
    params = config.rope_parameters
    thetas = layer_rope_theta(config, params)
    ropes = {theta: RotaryEmbedding(config.head_dim, {**params, "rope_theta": theta or params["rope_theta"]},
                                    config.context_length) for theta in set(thetas)}  # (a NoPE layer's is unused)
    blocks = []
    for i, (kind, theta) in enumerate(zip(layer_types(config), thetas, strict=True)):
        p = f"model.layers.{i}."
        attention = GQAAttention(
            config, weights, p + "self_attn.", ropes[theta], dtype, qk_norm=False, scale=get("attention_multiplier"),
            rotary=apply_rotary if theta else None,
            window=int(window) if kind == "sliding_attention" and window is not None else None,
            sinks=weights.get(p + "self_attn.sinks"))
        blocks.append(Block(weights.get(p + "input_layernorm.weight"), attention,
                            weights.get(p + "post_attention_layernorm.weight"), GraniteMoE(config, weights, i, executor)))
    return DecoderModel(config, weights, blocks, dtype, embedding_multiplier=get("embedding_multiplier"),
                        residual_multiplier=get("residual_multiplier"), logits_scaling=get("logits_scaling"))
