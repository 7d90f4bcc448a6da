"""SK Telecom A.X-K1 (axk1): DeepSeek-V3's model (multi-head latent attention with the low-rank
query, interleaved RoPE on the qk_rope_head_dim channels; dense MLPs where `mlp_layer_types` says
"dense", else the sigmoid-routed, group-limited MoE with shared experts: deepseek_v3.py) with one
change: the MoE block's output, routed plus shared, goes through an RMSNorm of its own
(`post_mlp_layernorm`) before the residual.

The releases store that norm beside the layer's other norms (`model.layers.N.post_mlp_layernorm`,
on the dense layers too, where nothing reads it) and route without a correction bias; transformers
names it `mlp.post_mlp_layernorm` (the converter renames the release's: ftw/families.py) and fills
the missing bias with zeros, as SigmoidMoE does.
"""

from __future__ import annotations

import torch

from ..config import ModelConfig
from ..experts import ExpertExecutor
from ..layers.norm import rms_norm
from ..loading.read_ftw import ModelWeights
from .base import FFN, DecoderModel
from .deepseek_v3 import SigmoidMoE, build_mla
from .qwen3_moe import dense_mlp

# AXK1Config's defaults, for a config.json that leaves a key out
DEFAULTS = dict(n_group=8, topk_group=4, norm_topk_prob=True, routed_scaling_factor=2.5, n_shared_experts=1,
                rope_interleave=True)

# transformers keeps these in float32 (_keep_in_fp32_modules_strict): routing must not see bf16-rounded values
KEEP_FLOAT32 = ("e_score_correction_bias", "mlp.gate.weight")


class NormedMoE:
    """DeepSeek-V3's MoE, its output RMSNormed (`post_mlp_layernorm`)."""

    def __init__(self, moe: SigmoidMoE, norm: torch.Tensor, eps: float) -> None:
        self.moe, self.norm, self.eps = moe, norm, eps

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(self.moe(x), self.norm, self.eps)


def build(config: ModelConfig, weights: ModelWeights, executor: ExpertExecutor, dtype: torch.dtype) -> DecoderModel:
    def feed_forward(layer: int) -> FFN:
        prefix = f"model.layers.{layer}.mlp."
        if layer not in config.moe_layers:
            return dense_mlp(weights, prefix)
        bias = "gate.e_score_correction_bias"
        moe = SigmoidMoE(config, weights, layer, prefix, executor, DEFAULTS,
                         bias=bias if weights.maybe(prefix + bias) is not None else None)
        return NormedMoE(moe, weights.get(prefix + "post_mlp_layernorm.weight"), config.rms_norm_eps)

    return build_mla(config, weights, executor, dtype, DEFAULTS, feed_forward)
