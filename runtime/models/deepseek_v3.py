"""DeepSeek-V3 (and R1, Kimi K2): multi-head latent attention (layers/mla.py); dense MLP on the
first `first_k_dense_replace` layers; MoE with sigmoid group-limited routing plus shared experts.
GLM-5 (glm_moe_dsa.py) is this block with a sparse token selection in its attention."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from ..config import ModelConfig
from ..experts import ExpertExecutor
from ..layers.mla import MLAttention
from ..layers.mlp import sigmoid_group_topk
from ..layers.rope import RotaryEmbedding
from ..loading.read_ftw import ModelWeights
from .base import FFN, Block, DecoderModel, Mixer
from .qwen3_moe import dense_mlp

# DeepseekV3Config's defaults, for checkpoints whose config.json leaves a key out
DEFAULTS = dict(n_group=8, topk_group=4, norm_topk_prob=True, routed_scaling_factor=2.5, n_shared_experts=1,
                rope_interleave=True)

# transformers keeps these in float32 (_keep_in_fp32_modules): routing must not see bf16-rounded values
KEEP_FLOAT32 = ("e_score_correction_bias", "mlp.gate.weight")


class SigmoidMoE:
    """Router (sigmoid scores, `e_score_correction_bias`, group-limited top-k) + routed experts
    through the executor + shared experts (a dense SwiGLU) added to the routed output. `bias`: the
    correction bias's name under the MLP's prefix (EXAONE keeps it beside the router, not in it);
    None: no correction bias (A.X-K1's releases route without one: zeros, as transformers fills it).
    `shared_mlp` makes the shared experts' MLP from its prefix (Nemotron-H's is not gated);
    `dropped`: the choice score of the experts of dropped groups (sigmoid_group_topk's);
    `scale_after_sum`: `routed_scaling_factor` multiplies the experts' weighted sum, not each weight
    (Beam's: the same in float32, a rounding apart in 16 bits)."""

    def __init__(self, config: ModelConfig, weights: ModelWeights, layer: int, prefix: str,
                 executor: ExpertExecutor, defaults: dict[str, Any], *,
                 bias: str | None = "gate.e_score_correction_bias",
                 shared_mlp: Callable[[ModelWeights, str], FFN] = dense_mlp, dropped: float = float("-inf"),
                 scale_after_sum: bool = False) -> None:
        def get(key: str) -> Any:
            return config.get(key, defaults[key])

        self.router = weights.get(prefix + "gate.weight")
        self.bias = weights.get(prefix + bias) if bias is not None else (
            torch.zeros(config.num_experts, dtype=torch.float32, device=self.router.device))
        self.shared = shared_mlp(weights, prefix + "shared_experts.") if get("n_shared_experts") else None
        self.layer, self.executor, self.k = layer, executor, config.num_experts_per_tok
        self.num_groups, self.topk_groups = int(get("n_group")), int(get("topk_group"))
        self.normalize, self.scaling = bool(get("norm_topk_prob")), float(get("routed_scaling_factor"))
        self.dropped, self.scale_after_sum = dropped, scale_after_sum

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        # transformers keeps the router in float32 and routes in float32 whatever the model dtype
        logits = F.linear(x.to(torch.float32), self.router.to(torch.float32))
        ids, weights = sigmoid_group_topk(logits, self.bias, self.k, self.num_groups, self.topk_groups,
                                          self.normalize, 1.0 if self.scale_after_sum else self.scaling, self.dropped)
        routed = self.executor(self.layer, x, ids, weights.to(x.dtype))
        routed = routed * self.scaling if self.scale_after_sum else routed
        return routed if self.shared is None else routed + self.shared(x)


def ffn(config: ModelConfig, weights: ModelWeights, layer: int, executor: ExpertExecutor, defaults: dict[str, Any]) -> FFN:
    prefix = f"model.layers.{layer}.mlp."
    if layer in config.moe_layers:
        return SigmoidMoE(config, weights, layer, prefix, executor, defaults)
    return dense_mlp(weights, prefix)


def rotary(config: ModelConfig) -> RotaryEmbedding:
    """RoPE on the qk_rope_head_dim channels only (transformers points `head_dim` at them)."""
    return RotaryEmbedding(int(config.get("qk_rope_head_dim")), config.rope_parameters, config.context_length)


def block(config: ModelConfig, weights: ModelWeights, layer: int, mixer: Mixer, feed_forward: FFN) -> Block:
    p = f"model.layers.{layer}."
    return Block(weights.get(p + "input_layernorm.weight"), mixer, weights.get(p + "post_attention_layernorm.weight"), feed_forward)


def build(config: ModelConfig, weights: ModelWeights, executor: ExpertExecutor, dtype: torch.dtype) -> DecoderModel:
    return build_mla(config, weights, executor, dtype, DEFAULTS)


def build_mla(config: ModelConfig, weights: ModelWeights, executor: ExpertExecutor, dtype: torch.dtype,
              defaults: dict[str, Any], feed_forward: Callable[[int], FFN] | None = None) -> DecoderModel:
    """DeepSeek-V3's model with a family's `defaults` for the keys its config.json leaves out
    (GLM-4.7-Flash's is this model with GLM's); `feed_forward(layer)`, where given, each layer's FFN
    in place of `ffn`'s (A.X-K1's MoE output is normed)."""
    rope, interleave = rotary(config), bool(config.get("rope_interleave", defaults["rope_interleave"]))
    blocks = []
    for i in range(config.num_layers):
        attention = MLAttention(config, weights, f"model.layers.{i}.self_attn.", rope, dtype, interleave=interleave)
        layer_ffn = ffn(config, weights, i, executor, defaults) if feed_forward is None else feed_forward(i)
        blocks.append(block(config, weights, i, attention, layer_ffn))
    return DecoderModel(config, weights, blocks, dtype)
