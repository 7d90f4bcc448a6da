"""gpt-oss (gpt_oss: gpt-oss-20b, gpt-oss-120b): GQA attention with biases and a learned sink
logit per head (layers/sink_attention.py), in two kinds of layer as `layer_types` says: sliding
ones attend within a window of `sliding_window` positions, full ones to everything; YaRN RoPE
(rotate-half) on both. Every layer is a MoE: a router with a bias, softmax over its top-k logits,
experts with biases and gpt-oss's clamped SwiGLU (their records carry both: the converter writes
the activation into each bank, ftw/families.py, and the executor computes it), their weights
MXFP4 as released (or a float dtype asked for at conversion). The CPU kernel computes them, MXFP4
with int8 products; on the GPU the block kernel reads MXFP4 records in place (the slot kernel
float ones) with the activation, and the biases gathered from the pairs' slots are added
(runtime/gpu/slot_compute.py).

RMSNorm as GptOssRMSNorm has it: the weight kept in float32 (transformers' _keep_in_fp32_modules)
times the float32 normalized input, cast back after the multiply.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..config import ModelConfig
from ..experts import ExpertExecutor
from ..layers.attention import KVCache, Start
from ..layers.linear import linear
from ..layers.mlp import softmax_topk
from ..layers.rope import RotaryEmbedding, apply_rotary
from ..layers.sink_attention import sink_causal_attention
from ..loading.read_ftw import ModelWeights
from .base import Block, DecoderModel
from .layer_schedule import layer_types as checked_layer_types
from .qwen3_moe import GQAAttention

# GptOssConfig's defaults, for checkpoints whose config.json leaves a key out
DEFAULTS = dict(sliding_window=128, rms_norm_eps=1e-5)

KEEP_FLOAT32 = ("layernorm.weight", "model.norm.weight")  # (transformers keeps its norms in float32)


@dataclass(frozen=True)
class Float32RMSNorm:
    """GptOssRMSNorm: weight * normalize(x), both in float32, then x's dtype."""

    weight: torch.Tensor
    eps: float

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return (self.weight.to(torch.float32) * h).to(x.dtype)


class SinkAttention(GQAAttention):
    """q/k/v/o projections with biases, RoPE, causal attention with the head's sink logit, within
    `window` positions (a sliding layer) or over every earlier one (`window` None)."""

    def __init__(self, config: ModelConfig, weights: ModelWeights, prefix: str, rope: RotaryEmbedding,
                 dtype: torch.dtype, *, window: int | None) -> None:
        super().__init__(config, weights, prefix, rope, dtype, qk_norm=False)
        self.sinks = weights.get(prefix + "sinks")  # [Hq]
        self.window = window

    def __call__(self, x: torch.Tensor, positions: torch.Tensor, cache: KVCache, start: Start) -> torch.Tensor:
        t = x.shape[0]
        q = linear(x, self.q, self.q_bias).view(t, self.heads, self.head_dim)  # [T, Hq, D]
        k = linear(x, self.k, self.k_bias).view(t, self.kv_heads, self.head_dim)  # [T, Hkv, D]
        v = linear(x, self.v, self.v_bias).view(t, self.kv_heads, self.head_dim)
        cos, sin = self.rope(positions, x.dtype)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        keys, values = cache.append(start, k, v)
        out = sink_causal_attention(q, keys, values, start, self.scale, self.sinks, self.window)
        return linear(out.reshape(t, self.heads * self.head_dim), self.o, self.o_bias)


class BiasedRouterMoE:
    """Router (logits with a bias; softmax over the top k, which softmax_topk renormalized is) +
    routed experts through the executor (their biases and clamped SwiGLU are the banks')."""

    def __init__(self, config: ModelConfig, weights: ModelWeights, layer: int, prefix: str,
                 executor: ExpertExecutor) -> None:
        self.router, self.bias = weights.get(prefix + "router.weight"), weights.get(prefix + "router.bias")
        self.layer, self.executor, self.k = layer, executor, config.num_experts_per_tok

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        ids, weights = softmax_topk(linear(x, self.router, self.bias), self.k, normalize=True)
        return self.executor(self.layer, x, ids, weights.to(x.dtype))


def layer_types(config: ModelConfig) -> list[str]:
    """`layer_types`, else GptOssConfig's schedule: sliding and full layers in turn, sliding first."""
    return checked_layer_types(config, "gpt-oss", lambda i: "sliding_attention" if (i + 1) % 2 else "full_attention")


def build(config: ModelConfig, weights: ModelWeights, executor: ExpertExecutor, dtype: torch.dtype) -> DecoderModel:
    window = config.source.get("sliding_window", DEFAULTS["sliding_window"])  # (null: the sliding layers see all)
    rope = RotaryEmbedding(config.head_dim, config.rope_parameters, config.context_length)

    def norm(name: str) -> Float32RMSNorm:
        return Float32RMSNorm(weights.get(name), float(config.get("rms_norm_eps", DEFAULTS["rms_norm_eps"])))

    blocks = []
    for i, kind in enumerate(layer_types(config)):
        p = f"model.layers.{i}."
        attention = SinkAttention(config, weights, p + "self_attn.", rope, dtype,
                                  window=int(window) if kind == "sliding_attention" and window is not None else None)
        blocks.append(Block(norm(p + "input_layernorm.weight"), attention, norm(p + "post_attention_layernorm.weight"),
                            BiasedRouterMoE(config, weights, i, p + "mlp.", executor)))
    return DecoderModel(config, weights, blocks, dtype, final_norm=norm("model.norm.weight"))
