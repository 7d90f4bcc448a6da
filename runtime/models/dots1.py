"""dots.llm1 (dots1, rednote-hilab): Qwen3's attention (GQA, per-head q/k RMSNorm before full RoPE;
qwen3_moe.py) with DeepSeek-V3's feed-forward: dense MLPs on the first `first_k_dense_replace`
layers, then a sigmoid-routed MoE with a correction bias and shared experts (deepseek_v3.py).
Layers of `layer_types` "sliding_attention" (from `max_window_layers` on, where `sliding_window` is
set; none in the released checkpoints) are refused."""

from __future__ import annotations

import torch

from ..config import ModelConfig, UnsupportedFamilyError
from ..experts import ExpertExecutor
from ..layers.rope import RotaryEmbedding
from ..loading.read_ftw import ModelWeights
from .base import DecoderModel
from .deepseek_v3 import block, ffn
from .qwen3_moe import GQAAttention

# Dots1Config's defaults, for checkpoints whose config.json leaves a key out
DEFAULTS = dict(n_group=1, topk_group=1, norm_topk_prob=False, routed_scaling_factor=1.0, n_shared_experts=None,
                sliding_window=4096, max_window_layers=62)

# transformers keeps these in float32 (_keep_in_fp32_modules_strict): routing must not see bf16-rounded values
KEEP_FLOAT32 = ("e_score_correction_bias", "mlp.gate.weight")


def sliding_layers(config: ModelConfig) -> list[int]:
    """The layers `layer_types` (else Dots1Config's derivation of it) makes sliding-window ones."""
    types = config.get("layer_types")
    if types is None:
        window = config.source.get("sliding_window", DEFAULTS["sliding_window"])  # (null: none)
        first = int(config.get("max_window_layers", DEFAULTS["max_window_layers"]))
        types = ["sliding_attention" if window is not None and i >= first else "full_attention"
                 for i in range(config.num_layers)]
    return [i for i, kind in enumerate(types) if kind == "sliding_attention"]


def build(config: ModelConfig, weights: ModelWeights, executor: ExpertExecutor, dtype: torch.dtype) -> DecoderModel:
    sliding = sliding_layers(config)
    if sliding:
        raise UnsupportedFamilyError(f"dots1 with sliding-window attention layers ({sliding}, a window of "
                                     f"{config.get('sliding_window')} tokens) is not supported yet")
    rope = RotaryEmbedding(config.head_dim, config.rope_parameters, config.context_length)
    blocks = []
    for i in range(config.num_layers):
        attention = GQAAttention(config, weights, f"model.layers.{i}.self_attn.", rope, dtype, qk_norm=True)
        blocks.append(block(config, weights, i, attention, ffn(config, weights, i, executor, DEFAULTS)))
    return DecoderModel(config, weights, blocks, dtype)
