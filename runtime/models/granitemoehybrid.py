"""IBM Granite 4.0 hybrid (granitemoehybrid): Mamba2 layers (layers/mamba2.py) and GQA attention
layers as `layer_types` says ("mamba" or "attention" in the releases' config.json; transformers'
"linear_attention" and "full_attention"), every layer followed by granitemoeshared's block (a
softmax top-k MoE plus a shared SwiGLU MLP, added), all under Granite's multipliers (granitemoe.py).
Attention rotates queries and keys only where `position_embedding_type` is "rope" (the releases
say "nope": no position encoding; the Mamba2 layers carry the order).
"""

from __future__ import annotations

import torch

from ..config import ModelConfig, UnsupportedFamilyError
from ..experts import ExpertExecutor
from ..layers.mamba2 import Mamba2Mixer
from ..layers.rope import RotaryEmbedding, apply_rotary
from ..loading.read_ftw import ModelWeights
from .base import Block, DecoderModel, Mixer
from .granitemoe import DEFAULTS, GraniteMoE
from .qwen3_moe import GQAAttention

# a layer type as the releases write it, or as transformers >= 5 remaps it (configuration_utils)
LAYER_KINDS = {"mamba": "mamba", "linear_attention": "mamba", "attention": "attention", "full_attention": "attention"}


def layer_kinds(config: ModelConfig | dict) -> list[str]:
    """Each layer's "mamba" or "attention" (every layer Mamba2 where the config lists none, as
    GraniteMoeHybridConfig has it); UnsupportedFamilyError for a list ft cannot read."""
    layers = int(config.get("num_hidden_layers") or config.get("num_layers") or 0)
    types = config.get("layer_types") or config.get("layers_block_type") or ["mamba"] * layers
    if not isinstance(types, list) or len(types) != layers or any(t not in LAYER_KINDS for t in types):
        raise UnsupportedFamilyError(f"granitemoehybrid needs layer_types, one of mamba or attention a layer "
                                     f"({layers}); the config has {str(types)[:80]}")
    return [LAYER_KINDS[t] for t in types]


def build(config: ModelConfig, weights: ModelWeights, executor: ExpertExecutor, dtype: torch.dtype) -> DecoderModel:
    if config.get("hidden_act", "silu") != "silu":
        raise UnsupportedFamilyError(f"Granite 4.0 hybrid with hidden_act {config.get('hidden_act')!r} is not "
                                     "supported (the expert kernels compute SiLU)")

    def get(key: str) -> float:
        return float(config.get(key, DEFAULTS[key]))

    rope = RotaryEmbedding(config.head_dim, config.rope_parameters, config.context_length)
    rotary = apply_rotary if config.get("position_embedding_type") == "rope" else None
    blocks = []
    for i, kind in enumerate(layer_kinds(config)):
        p = f"model.layers.{i}."
        mixer: Mixer = (Mamba2Mixer(config, weights, p + "mamba.", dtype) if kind == "mamba" else
                        GQAAttention(config, weights, p + "self_attn.", rope, dtype, qk_norm=False,
                                     scale=get("attention_multiplier"), rotary=rotary))
        blocks.append(Block(weights.get(p + "input_layernorm.weight"), mixer, weights.get(p + "post_attention_layernorm.weight"),
                            GraniteMoE(config, weights, i, executor, shared=True)))
    return DecoderModel(config, weights, blocks, dtype, embedding_multiplier=get("embedding_multiplier"),
                        residual_multiplier=get("residual_multiplier"), logits_scaling=get("logits_scaling"))
