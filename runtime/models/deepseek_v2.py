"""DeepSeek-V2 and V2-Lite (deepseek_v2): DeepSeek-V3's block (multi-head latent attention with
interleaved RoPE, dense MLPs on the first `first_k_dense_replace` layers, shared experts beside
the routed ones; deepseek_v3.py) with V2's router: softmax scores, the top k taken plainly
("greedy") or from the best groups ("group_limited_greedy"), times `routed_scaling_factor`,
never renormalized and with no correction bias."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from ..config import ModelConfig
from ..experts import ExpertExecutor
from ..layers.mla import MLAttention
from ..layers.mlp import softmax_group_topk
from ..loading.read_ftw import ModelWeights
from .base import FFN, DecoderModel
from .deepseek_v3 import block, rotary
from .qwen3_moe import dense_mlp

# DeepseekV2Config's defaults, for checkpoints whose config.json leaves a key out
DEFAULTS = dict(topk_method="greedy", n_group=1, topk_group=1, routed_scaling_factor=1.0, n_shared_experts=2)

# transformers keeps the router in float32 and routes in float32 whatever the model dtype
KEEP_FLOAT32 = ("mlp.gate.weight",)


class SoftmaxGroupMoE:
    """V2's router + routed experts through the executor + the shared experts' dense SwiGLU."""

    def __init__(self, config: ModelConfig, weights: ModelWeights, layer: int, prefix: str,
                 executor: ExpertExecutor) -> None:
        def get(key: str) -> Any:
            value = config.get(key)
            return DEFAULTS[key] if value is None else value

        method = get("topk_method")
        if method not in ("greedy", "group_limited_greedy"):
            raise ValueError(f"DeepSeek-V2 topk_method {method!r} is not supported (greedy, group_limited_greedy)")
        self.router = weights.get(prefix + "gate.weight")
        self.shared = dense_mlp(weights, prefix + "shared_experts.") if get("n_shared_experts") else None
        self.layer, self.executor, self.k = layer, executor, config.num_experts_per_tok
        grouped = method == "group_limited_greedy"
        self.num_groups, self.topk_groups = (int(get("n_group")), int(get("topk_group"))) if grouped else (1, 1)
        self.scaling = float(get("routed_scaling_factor"))

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        logits = F.linear(x.to(torch.float32), self.router.to(torch.float32))
        ids, weights = softmax_group_topk(logits, self.k, self.num_groups, self.topk_groups, self.scaling)
        routed = self.executor(self.layer, x, ids, weights.to(x.dtype))
        return routed if self.shared is None else routed + self.shared(x)


def ffn(config: ModelConfig, weights: ModelWeights, layer: int, executor: ExpertExecutor) -> FFN:
    prefix = f"model.layers.{layer}.mlp."
    if layer in config.moe_layers:
        return SoftmaxGroupMoE(config, weights, layer, prefix, executor)
    return dense_mlp(weights, prefix)


def build(config: ModelConfig, weights: ModelWeights, executor: ExpertExecutor, dtype: torch.dtype) -> DecoderModel:
    rope = rotary(config)
    blocks = []
    for i in range(config.num_layers):
        attention = MLAttention(config, weights, f"model.layers.{i}.self_attn.", rope, dtype, interleave=True)
        blocks.append(block(config, weights, i, attention, ffn(config, weights, i, executor)))
    return DecoderModel(config, weights, blocks, dtype)
