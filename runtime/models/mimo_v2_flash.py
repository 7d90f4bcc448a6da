"""Xiaomi MiMo-V2-Flash (mimo_v2_flash): GQA attention with values narrower than keys (`v_head_dim`
beside `head_dim`), scaled by `attention_value_scale` before they are cached, RoPE on the first
`partial_rotary_factor` of each head's channels; two kinds of layer as `layer_types` says: full
ones attend to everything, sliding ones within `sliding_window` positions with twice the
key-value heads and a learned sink logit per head (layers/sink_attention.py), each kind with its
own rope base (`rope_parameters` keyed by layer type). Dense SwiGLU MLPs where `mlp_layer_types`
says "dense", elsewhere DeepSeek-V3's sigmoid-routed MoE without shared experts (deepseek_v3.py).
The multi-token-prediction weights (`model.mtp.`) are dropped at conversion."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch

from ..config import ModelConfig, UnsupportedFamilyError
from ..experts import ExpertExecutor
from ..layers.attention import KVCache, Start, causal_attention
from ..layers.linear import linear
from ..layers.rope import RotaryEmbedding, apply_rotary
from ..layers.sink_attention import sink_causal_attention
from ..loading.read_ftw import ModelWeights
from .base import FFN, Block, DecoderModel
from .deepseek_v3 import SigmoidMoE
from .qwen3_moe import GQAAttention, dense_mlp

# MiMoV2FlashConfig's defaults, for checkpoints whose config.json leaves a key out
DEFAULTS = dict(n_group=1, topk_group=1, norm_topk_prob=True, routed_scaling_factor=1.0, n_shared_experts=0,
                v_head_dim=128, sliding_window=129, attention_value_scale=0.707)
ROPE_DEFAULTS = {"full_attention": {"rope_type": "default", "rope_theta": 5_000_000.0, "partial_rotary_factor": 0.334},
                 "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0, "partial_rotary_factor": 0.334}}

# transformers keeps these in float32 (_keep_in_fp32_modules_strict): routing must not see bf16-rounded values
KEEP_FLOAT32 = ("e_score_correction_bias", "mlp.gate.weight")


class MiMoAttention(GQAAttention):
    """q/k/v/o projections (values `v_dim` wide, times `value_scale`), partial RoPE, causal
    attention over every earlier position (`window` None) or within `window` positions with the
    head's sink logit (`sinks`)."""

    def __init__(self, config: ModelConfig, weights: ModelWeights, prefix: str, rope: RotaryEmbedding,
                 dtype: torch.dtype, *, kv_heads: int, v_dim: int, value_scale: float, window: int | None) -> None:
        super().__init__(replace(config, num_key_value_heads=kv_heads), weights, prefix, rope, dtype, qk_norm=False)
        self.v_dim, self.value_scale, self.window = v_dim, value_scale, window
        self.sinks = weights.get(prefix + "sinks") if window is not None else None  # [Hq]

    def new_cache(self, max_tokens: int) -> KVCache:
        return KVCache(max_tokens, self.kv_heads, self.head_dim, self.v_dim, self.dtype)

    def __call__(self, x: torch.Tensor, positions: torch.Tensor, cache: KVCache, start: Start) -> torch.Tensor:
        t = x.shape[0]
        q = linear(x, self.q, self.q_bias).view(t, self.heads, self.head_dim)  # [T, Hq, D]
        k = linear(x, self.k, self.k_bias).view(t, self.kv_heads, self.head_dim)  # [T, Hkv, D]
        v = linear(x, self.v, self.v_bias).view(t, self.kv_heads, self.v_dim) * self.value_scale  # [T, Hkv, Dv]
        cos, sin = self.rope(positions, x.dtype)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        keys, values = cache.append(start, k, v)
        if self.sinks is None:
            out = causal_attention(q, keys, values, start, self.scale)
        else:
            out = sink_causal_attention(q, keys, values, start, self.scale, self.sinks, self.window)
        return linear(out.reshape(t, self.heads * self.v_dim), self.o)


def layer_types(num_layers: int, types: Any) -> list[str]:
    """`layer_types`, else MiMoV2FlashConfig's schedule: layer 0 and every 6th full, the rest sliding."""
    if types is None:
        types = ["full_attention" if i == 0 or not (i + 1) % 6 else "sliding_attention" for i in range(num_layers)]
    if len(types) != num_layers or set(types) - {"sliding_attention", "full_attention"}:
        raise UnsupportedFamilyError(f"unsupported mimo_v2_flash layer_types {types!r} for {num_layers} layers")
    return list(types)


def rope_parameters(config: ModelConfig) -> dict[str, dict[str, Any]]:
    """The rope of each layer type: `rope_parameters` keyed by layer type, else the release's."""
    params = config.get("rope_parameters")
    if params is None:
        return ROPE_DEFAULTS
    if not isinstance(params, dict) or set(params) != set(ROPE_DEFAULTS):
        raise UnsupportedFamilyError(f"mimo_v2_flash needs rope_parameters per layer type (full_attention and "
                                     f"sliding_attention), as transformers reads them; the config has {str(params)[:80]}")
    return params


def build(config: ModelConfig, weights: ModelWeights, executor: ExpertExecutor, dtype: torch.dtype) -> DecoderModel:
    def get(key: str) -> Any:
        return config.get(key, DEFAULTS[key])

    window = int(config.get("sliding_window_size")) + 1 if config.get("sliding_window_size") is not None else (
        int(get("sliding_window")))
    ropes = {kind: RotaryEmbedding(int(config.head_dim * float(p.get("partial_rotary_factor", 0.334))),
                                   {**p, "rope_type": p.get("rope_type", "default")}, config.context_length)
             for kind, p in rope_parameters(config).items()}
    value_scale = config.source.get("attention_value_scale", DEFAULTS["attention_value_scale"])
    value_scale = 1.0 if value_scale is None else float(value_scale)  # (null: unscaled, as transformers reads it)
    blocks = []
    for i, kind in enumerate(layer_types(config.num_layers, config.get("layer_types"))):
        p = f"model.layers.{i}."
        sliding = kind == "sliding_attention"
        attention = MiMoAttention(config, weights, p + "self_attn.", ropes[kind], dtype,
                                  kv_heads=config.num_key_value_heads * (2 if sliding else 1), v_dim=int(get("v_head_dim")),
                                  value_scale=value_scale, window=window if sliding else None)
        ffn: FFN = (SigmoidMoE(config, weights, i, p + "mlp.", executor, DEFAULTS) if i in config.moe_layers
                    else dense_mlp(weights, p + "mlp."))
        blocks.append(Block(weights.get(p + "input_layernorm.weight"), attention,
                            weights.get(p + "post_attention_layernorm.weight"), ffn))
    return DecoderModel(config, weights, blocks, dtype)
