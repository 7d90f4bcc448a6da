"""IBM Granite 3.x MoE (granitemoe) and its shared-expert variant (granitemoeshared): Mixtral's
block (GQA attention without q/k norms, every layer a softmax top-k MoE weighed over the chosen
experts) under Granite's multipliers: embeddings times `embedding_multiplier`, attention scores
scaled by `attention_multiplier` (not 1/sqrt(head_dim)), each residual branch times
`residual_multiplier`, logits divided by `logits_scaling` (DecoderModel applies all but the
attention one).

Experts are fused on disk (`block_sparse_moe.input_linear` [E, 2I, H], gate rows then up;
`output_linear` [E, H, I]); the converter makes them FTW's w13/w2 (ftw/families.py). The router
is `block_sparse_moe.router.layer.weight` (`router.weight` as transformers >= 5 saves without its
original names). granitemoeshared adds a dense SwiGLU beside the routed experts, its gate and up
fused as `shared_mlp.input_linear` [2S, H], added before the residual multiplier.
"""

from __future__ import annotations

import torch

from ..config import ModelConfig, UnsupportedFamilyError
from ..experts import ExpertExecutor
from ..layers.mlp import swiglu_mlp
from ..layers.rope import RotaryEmbedding
from ..loading.read_ftw import ModelWeights
from .base import FFN, Block, DecoderModel
from .qwen3_moe import GQAAttention, SoftmaxMoE

# GraniteMoeConfig's defaults, for a config.json that leaves a multiplier out
DEFAULTS = dict(embedding_multiplier=1.0, attention_multiplier=1.0, residual_multiplier=1.0, logits_scaling=1.0)


def shared_mlp(weights: ModelWeights, prefix: str) -> FFN:
    """`shared_mlp.`'s SwiGLU: input_linear's first half of rows gate, the second up (transformers'
    chunk(2)); row halves of a contiguous matrix are contiguous views, not copies."""
    gate, up = weights.get(prefix + "input_linear.weight").chunk(2)
    down = weights.get(prefix + "output_linear.weight")
    return lambda x: swiglu_mlp(x, gate, up, down)


class GraniteMoE:
    """Router (top-k logits, softmax over them: softmax_topk renormalized is the same weights) +
    routed experts through the executor + the shared MLP where the layer has one."""

    def __init__(self, config: ModelConfig, weights: ModelWeights, layer: int, executor: ExpertExecutor,
                 *, shared: bool | None = None) -> None:
        """`shared`: whether the layer has a shared MLP (None: where the config sizes one; Granite 4.0's
        hybrid always has one, its width perhaps left to the config class's default)."""
        prefix = f"model.layers.{layer}."
        router = prefix + "block_sparse_moe.router.layer.weight"
        if weights.maybe(router) is None:
            router = prefix + "block_sparse_moe.router.weight"
        self.routed = SoftmaxMoE(config, weights, layer, router, executor, normalize=True)
        if shared is None:
            shared = bool(config.get("shared_intermediate_size"))
        self.shared = shared_mlp(weights, prefix + "shared_mlp.") if shared else None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        routed = self.routed(x)
        return routed if self.shared is None else routed + self.shared(x)


def build(config: ModelConfig, weights: ModelWeights, executor: ExpertExecutor, dtype: torch.dtype) -> DecoderModel:
    if config.get("hidden_act", "silu") != "silu":
        raise UnsupportedFamilyError(f"Granite MoE with hidden_act {config.get('hidden_act')!r} is not supported "
                                     "(the expert kernels compute SiLU)")
    def get(key: str) -> float:
        return float(config.get(key, DEFAULTS[key]))

    rope = RotaryEmbedding(config.head_dim, config.rope_parameters, config.context_length)
    blocks = []
    for i in range(config.num_layers):
        p = f"model.layers.{i}."
        attention = GQAAttention(config, weights, p + "self_attn.", rope, dtype, qk_norm=False,
                                 scale=get("attention_multiplier"))
        blocks.append(Block(weights.get(p + "input_layernorm.weight"), attention,
                            weights.get(p + "post_attention_layernorm.weight"), GraniteMoE(config, weights, i, executor)))
    return DecoderModel(config, weights, blocks, dtype, embedding_multiplier=get("embedding_multiplier"),
                        residual_multiplier=get("residual_multiplier"), logits_scaling=get("logits_scaling"))
