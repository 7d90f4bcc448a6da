"""Recursive Flint (flint): Qwen3-MoE's attention (GQA with per-head q/k RMSNorms; qwen3_moe.py)
with a learned sink logit per head on every layer (layers/sink_attention.py), in two kinds of
layer as `layer_types` says: sliding ones rotate (RoPE) and attend within `sliding_window`
positions, full ones attend to everything without any position encoding (NoPE). A dense SwiGLU
MLP on `mlp_only_layers` (FlintConfig's [0, 1] where absent), elsewhere a MoE: sigmoid scores of
a float32 router, the top k by score (no correction bias), renormalized where `norm_topk_prob`,
plus one shared SwiGLU expert (`shared_expert`, `shared_expert_intermediate_size` wide) added
in full, with no gate (Qwen2-MoE's gates it).

Every RMSNorm is GptOssRMSNorm (the weight multiplies the float32 normalized input before the
cast back): the block and final norms run so here; the q/k norms run the shared `rms_norm`, a
rounding apart in 16 bits. The release names the sinks `softmax_offset` (renamed at conversion,
ftw/families.py, as transformers' conversion_mapping does).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..config import ModelConfig, UnsupportedFamilyError
from ..experts import ExpertExecutor
from ..layers.mlp import sigmoid_group_topk
from ..layers.norm import Float32RMSNorm
from ..layers.rope import apply_rotary, whole_head_rope
from ..loading.read_ftw import ModelWeights
from .base import FFN, Block, DecoderModel
from .layer_schedule import layer_types as checked_layer_types
from .qwen3_moe import GQAAttention, dense_mlp

# FlintConfig's defaults, for a config.json that leaves a key out
DEFAULTS = dict(sliding_window=513, norm_topk_prob=True)

# transformers keeps these in float32 (_keep_in_fp32_modules_strict): routing and the sinks must not
# see bf16-rounded values
KEEP_FLOAT32 = ("mlp.gate.weight", "self_attn.sinks")


class SigmoidSharedMoE:
    """Router (float32 logits, sigmoid scores, the top k by score, renormalized where `normalize`) +
    routed experts through the executor + an ungated shared SwiGLU expert added in full."""

    def __init__(self, config: ModelConfig, weights: ModelWeights, layer: int, prefix: str,
                 executor: ExpertExecutor, *, normalize: bool) -> None:
        self.router = weights.get(prefix + "gate.weight")
        self.no_bias = torch.zeros(config.num_experts, dtype=torch.float32, device=self.router.device)
        self.shared = dense_mlp(weights, prefix + "shared_expert.")
        self.layer, self.executor, self.k, self.normalize = layer, executor, config.num_experts_per_tok, normalize

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        logits = F.linear(x.to(torch.float32), self.router.to(torch.float32))
        ids, weights = sigmoid_group_topk(logits, self.no_bias, self.k, 1, 1, self.normalize, 1.0)
        return self.executor(self.layer, x, ids, weights.to(x.dtype)) + self.shared(x)


def layer_types(config: ModelConfig) -> list[str]:
    """`layer_types`, else FlintConfig's schedule: full on the first two layers, every fourth from
    layer 1 and the last; sliding elsewhere."""
    last = config.num_layers - 1
    return checked_layer_types(config, "flint", lambda i: "full_attention" if i < 2 or i % 4 == 1 or i == last
                               else "sliding_attention")


def build(config: ModelConfig, weights: ModelWeights, executor: ExpertExecutor, dtype: torch.dtype) -> DecoderModel:
    if config.get("hidden_act", "silu") != "silu":
        raise UnsupportedFamilyError("flint with another hidden_act than silu is not supported")
    types = layer_types(config)
    window = config.source.get("sliding_window", DEFAULTS["sliding_window"])
    if "sliding_attention" in types and not window:  # (transformers then rotates nothing and masks nothing)
        raise UnsupportedFamilyError("flint with sliding_attention layers but no sliding_window is not supported")
    rope = whole_head_rope(config, "flint")
    normalize = bool(config.get("norm_topk_prob", DEFAULTS["norm_topk_prob"]))

    def norm(name: str) -> Float32RMSNorm:
        return Float32RMSNorm(weights.get(name), config.rms_norm_eps)

    blocks = []
    for i, kind in enumerate(types):
        p = f"model.layers.{i}."
        sliding = kind == "sliding_attention"
        attention = GQAAttention(config, weights, p + "self_attn.", rope, dtype, qk_norm=True,
                                 rotary=apply_rotary if sliding else None, window=int(window) if sliding else None,
                                 sinks=weights.get(p + "self_attn.sinks"))
        ffn: FFN = (SigmoidSharedMoE(config, weights, i, p + "mlp.", executor, normalize=normalize)
                    if i in config.moe_layers else dense_mlp(weights, p + "mlp."))
        blocks.append(Block(norm(p + "input_layernorm.weight"), attention, norm(p + "post_attention_layernorm.weight"), ffn))
    return DecoderModel(config, weights, blocks, dtype, final_norm=norm("model.norm.weight"))
