"""Phi-3.5-MoE (phimoe): Mixtral's block with LayerNorms (weight and bias, eps `rms_norm_eps`)
for its RMSNorms, biases on the attention projections and the head where the config has them
(`attention_bias`, `lm_head_bias`), LongRoPE (layers/rope.py), and sparsemixer routing: always
two experts, each weighed by a softmax over the experts near it (layers/mlp.py).

The router is `block_sparse_moe.gate.weight` as the released checkpoints name it, `mlp.router.weight`
as transformers >= 5 saves without its original names; the experts are Mixtral's w1 (gate), w3
(up), w2 (down), or transformers' fused gate_up_proj / down_proj.
"""

from __future__ import annotations

import torch

from ..config import ModelConfig, UnsupportedFamilyError
from ..experts import ExpertExecutor
from ..layers.linear import linear
from ..layers.mlp import sparsemixer_top2
from ..layers.norm import LayerNorm
from ..layers.rope import RotaryEmbedding
from ..loading.read_ftw import ModelWeights
from .base import Block, DecoderModel
from .qwen3_moe import GQAAttention


class SparseMixerMoE:
    """Router (sparsemixer top-2, `router_jitter_noise` its eps) + routed experts through the executor."""

    def __init__(self, config: ModelConfig, weights: ModelWeights, layer: int, executor: ExpertExecutor) -> None:
        prefix = f"model.layers.{layer}."
        router = weights.maybe(prefix + "block_sparse_moe.gate.weight")
        self.router = weights.get(prefix + "mlp.router.weight") if router is None else router
        self.jitter_eps = float(config.get("router_jitter_noise", 0.01))  # (PhimoeConfig's default)
        self.layer, self.executor = layer, executor

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        ids, weights = sparsemixer_top2(linear(x, self.router), self.jitter_eps)
        return self.executor(self.layer, x, ids, weights.to(x.dtype))


def rotary(config: ModelConfig) -> RotaryEmbedding:
    """LongRoPE's original context from `rope_scaling`, else beside it (config.json has both)."""
    params = config.rope_parameters
    if params["rope_type"] == "longrope" and params.get("original_max_position_embeddings") is None:
        params["original_max_position_embeddings"] = config.get("original_max_position_embeddings")
    return RotaryEmbedding(config.head_dim, params, config.context_length)


def build(config: ModelConfig, weights: ModelWeights, executor: ExpertExecutor, dtype: torch.dtype) -> DecoderModel:
    window = config.get("sliding_window")
    if window and window < config.context_length:  # (the released 131072 over 131072 positions masks nothing)
        raise UnsupportedFamilyError(f"Phi-3.5-MoE with a sliding attention window of {window} tokens, shorter than "
                                     f"its context of {config.context_length}, is not supported yet")
    if config.get("hidden_act", "silu") != "silu":
        raise UnsupportedFamilyError(f"Phi-3.5-MoE with hidden_act {config.get('hidden_act')!r} is not supported "
                                     "(the expert kernels compute SiLU)")
    if config.num_experts_per_tok != 2:
        raise UnsupportedFamilyError(f"Phi-3.5-MoE routes with sparsemixer, which chooses two experts, not "
                                     f"num_experts_per_tok {config.num_experts_per_tok}")
    eps = float(config.get("rms_norm_eps", 1e-5))

    def layer_norm(name: str) -> LayerNorm:
        return LayerNorm(weights.get(name + ".weight"), weights.maybe(name + ".bias"), eps)

    rope = rotary(config)
    blocks = []
    for i in range(config.num_layers):
        p = f"model.layers.{i}."
        attention = GQAAttention(config, weights, p + "self_attn.", rope, dtype, qk_norm=False)
        blocks.append(Block(layer_norm(p + "input_layernorm"), attention, layer_norm(p + "post_attention_layernorm"),
                            SparseMixerMoE(config, weights, i, executor)))
    return DecoderModel(config, weights, blocks, dtype, final_norm=layer_norm("model.norm"))
