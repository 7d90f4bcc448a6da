"""AI21 Jamba (jamba): Mamba layers (layers/mamba.py) with a GQA attention layer every
`attn_layer_period` layers from `attn_layer_offset` (no position encoding: the Mamba layers carry
the order), each followed by a softmax top-k MoE every `expert_layer_period` layers from
`expert_layer_offset` (the converter's moe_layers) and a dense SwiGLU MLP elsewhere, both under
`feed_forward.`; a layer's FFN norm is `pre_ff_layernorm`, the final one `final_layernorm`.
"""

from __future__ import annotations

import torch

from ..config import ModelConfig, UnsupportedFamilyError
from ..experts import ExpertExecutor
from ..layers.mamba import MambaMixer
from ..layers.rope import RotaryEmbedding
from ..loading.read_ftw import ModelWeights
from .base import FFN, Block, DecoderModel, Mixer
from .qwen3_moe import GQAAttention, SoftmaxMoE, dense_mlp


def layer_kinds(config: ModelConfig | dict) -> list[str]:
    """Each layer's "attention" or "mamba", as JambaConfig.layers_block_type derives them
    (JambaConfig's period 8 and offset 4 where the config leaves them out)."""
    layers = int(config.get("num_hidden_layers") or config.get("num_layers") or 0)
    period, offset = (int(d if config.get(k) is None else config.get(k))
                      for k, d in (("attn_layer_period", 8), ("attn_layer_offset", 4)))
    return ["attention" if i % period == offset else "mamba" for i in range(layers)]


def build(config: ModelConfig, weights: ModelWeights, executor: ExpertExecutor, dtype: torch.dtype) -> DecoderModel:
    if config.get("hidden_act", "silu") != "silu":
        raise UnsupportedFamilyError(f"Jamba with hidden_act {config.get('hidden_act')!r} is not supported "
                                     "(the expert kernels compute SiLU)")
    rope = RotaryEmbedding(config.head_dim, config.rope_parameters, config.context_length)  # (unused: NoPE)
    blocks = []
    for i, kind in enumerate(layer_kinds(config)):
        p = f"model.layers.{i}."
        mixer: Mixer = (MambaMixer(config, weights, p + "mamba.", dtype) if kind == "mamba" else
                        GQAAttention(config, weights, p + "self_attn.", rope, dtype, qk_norm=False, rotary=None))
        ffn: FFN = (SoftmaxMoE(config, weights, i, p + "feed_forward.router.weight", executor, normalize=False)
                    if i in config.moe_layers else dense_mlp(weights, p + "feed_forward."))
        blocks.append(Block(weights.get(p + "input_layernorm.weight"), mixer, weights.get(p + "pre_ff_layernorm.weight"), ffn))
    return DecoderModel(config, weights, blocks, dtype, final_norm=weights.get("model.final_layernorm.weight"))
