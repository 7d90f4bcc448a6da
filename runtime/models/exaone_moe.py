"""K-EXAONE (exaone_moe): Qwen3's GQA attention (per-head q/k RMSNorms before RoPE) in two kinds
of layer, as `layer_types` says: local ones attend within a sliding window of `sliding_window`
positions with RoPE, global ones attend to everything with no position encoding at all (NoPE).
A dense SwiGLU MLP on the layers `mlp_layer_types` marks dense, DeepSeek-V3's MoE on the
others (deepseek_v3.py: sigmoid scores, the correction bias for the choice, group-limited top-k,
shared experts), its bias stored beside the router. The multi-token-prediction weights (`mtp.`)
are dropped at conversion."""

from __future__ import annotations

import torch

from ..config import ModelConfig, UnsupportedFamilyError
from ..experts import ExpertExecutor
from ..layers.attention import KVCache, Start, causal_attention, sliding_causal_attention
from ..layers.linear import linear
from ..layers.norm import rms_norm
from ..layers.rope import RotaryEmbedding, apply_rotary
from ..loading.read_ftw import ModelWeights
from .base import FFN, Block, DecoderModel
from .deepseek_v3 import SigmoidMoE
from .qwen3_moe import GQAAttention, dense_mlp

# ExaoneMoeConfig's defaults, for checkpoints whose config.json leaves a key out
DEFAULTS = dict(sliding_window=4096, sliding_window_pattern=4, num_shared_experts=1, n_group=1, topk_group=1,
                norm_topk_prob=True, routed_scaling_factor=2.5)

# transformers keeps these in float32 (_keep_in_fp32_modules_strict): routing must not see bf16-rounded values
KEEP_FLOAT32 = ("e_score_correction_bias", "mlp.gate.weight")


class LocalGlobalAttention(GQAAttention):
    """Attention with per-head q/k RMSNorms; a local layer (`window` positions) rotates queries and
    keys and attends within its window, a global one (`window` None) neither."""

    def __init__(self, config: ModelConfig, weights: ModelWeights, prefix: str, rope: RotaryEmbedding,
                 dtype: torch.dtype, *, window: int | None) -> None:
        super().__init__(config, weights, prefix, rope, dtype, qk_norm=True)
        self.window = window

    def __call__(self, x: torch.Tensor, positions: torch.Tensor, cache: KVCache, start: Start) -> torch.Tensor:
        return linear(self.attend(x, positions, cache, start), self.o, self.o_bias)

    def attend(self, x: torch.Tensor, positions: torch.Tensor, cache: KVCache, start: Start) -> torch.Tensor:
        """The attended values before o_proj, [T, heads x head_dim] (AfMoE gates them)."""
        t = x.shape[0]
        q = linear(x, self.q, self.q_bias).view(t, self.heads, self.head_dim)  # [T, Hq, D]
        k = linear(x, self.k, self.k_bias).view(t, self.kv_heads, self.head_dim)  # [T, Hkv, D]
        v = linear(x, self.v, self.v_bias).view(t, self.kv_heads, self.head_dim)
        q, k = rms_norm(q, self.q_norm, self.eps), rms_norm(k, self.k_norm, self.eps)
        if self.window is not None:
            cos, sin = self.rope(positions, x.dtype)
            q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        keys, values = cache.append(start, k, v)
        if self.window is None:
            out = causal_attention(q, keys, values, start, self.scale)
        else:
            out = sliding_causal_attention(q, keys, values, start, self.scale, self.window)
        return out.reshape(t, self.heads * self.head_dim)


def layer_types(config: ModelConfig) -> list[str]:
    """`layer_types`, else ExaoneMoeConfig's schedule: every `sliding_window_pattern`-th layer
    global, the others local."""
    types = config.get("layer_types")
    if types is None:
        pattern = config.get("sliding_window_pattern", DEFAULTS["sliding_window_pattern"])
        if isinstance(pattern, int) and not isinstance(pattern, bool) and pattern > 0:
            types = ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(config.num_layers)]
        else:
            raise UnsupportedFamilyError(f"EXAONE with sliding_window_pattern {pattern!r} and no layer_types is not "
                                         "supported (transformers reads a whole number there)")
    if len(types) != config.num_layers or set(types) - {"sliding_attention", "full_attention"}:
        raise UnsupportedFamilyError(f"unsupported EXAONE layer_types {types!r} for {config.num_layers} layers")
    return list(types)


def build(config: ModelConfig, weights: ModelWeights, executor: ExpertExecutor, dtype: torch.dtype) -> DecoderModel:
    window = int(config.get("sliding_window", DEFAULTS["sliding_window"]))  # (transformers takes no null here)
    rope = RotaryEmbedding(config.head_dim, config.rope_parameters, config.context_length)
    # DeepseekV3's keys for SigmoidMoE: EXAONE names its shared experts' count num_shared_experts
    defaults = {**DEFAULTS, "n_shared_experts": int(config.get("num_shared_experts", DEFAULTS["num_shared_experts"]))}
    blocks = []
    for i, kind in enumerate(layer_types(config)):
        p = f"model.layers.{i}."
        attention = LocalGlobalAttention(config, weights, p + "self_attn.", rope, dtype,
                                         window=window if kind == "sliding_attention" else None)
        # the bias beside the router as released, in it where transformers >= 5 saves its own layout
        bias = "e_score_correction_bias" if weights.maybe(p + "mlp.e_score_correction_bias") is not None else (
            "gate.e_score_correction_bias")
        ffn: FFN = (SigmoidMoE(config, weights, i, p + "mlp.", executor, defaults, bias=bias)
                    if i in config.moe_layers else dense_mlp(weights, p + "mlp."))
        blocks.append(Block(weights.get(p + "input_layernorm.weight"), attention,
                            weights.get(p + "post_attention_layernorm.weight"), ffn))
    return DecoderModel(config, weights, blocks, dtype)
