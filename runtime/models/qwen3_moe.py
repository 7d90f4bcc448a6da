"""Qwen3-MoE: GQA attention with per-head q/k RMSNorm; softmax top-k MoE (dense MLP on
`mlp_only_layers`). Mixtral is the same block without the q/k norms (see mixtral.py)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..config import ModelConfig, UnsupportedFamilyError
from ..experts import ExpertExecutor
from ..layers.attention import KVCache, Start, causal_attention, sliding_causal_attention
from ..layers.linear import linear
from ..layers.mlp import softmax_topk, swiglu_mlp
from ..layers.norm import l2_norm, rms_norm
from ..layers.rope import RotaryEmbedding, apply_rotary
from ..layers.sink_attention import sink_causal_attention
from ..loading.read_ftw import ModelWeights
from .base import FFN, Block, DecoderModel

# how queries and keys are rotated: (x [T, heads, D], cos, sin) -> x rotated (layers/rope.py)
Rotary = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


class GQAAttention:
    """q/k/v/o projections, optional per-head q/k RMSNorm, RoPE, causal attention over a KV cache;
    scores scaled by `scale` (1/sqrt(head_dim) where None). `rotary` rotates queries and keys (None:
    no position encoding, NoPE); `window`: attention within that many positions (None: all of them);
    `sinks` [Hq]: a learned sink logit per head in each query's softmax (layers/sink_attention.py);
    `query_scale`: positions [T] -> a factor a position (float32) the queries are multiplied by
    after rotation, in float32 (Beam's NoPE layers: layers/rope.log_length_query_scale).
    `norm_names` and `out_name` name the q/k norms and the output projection under `prefix`.
    `head_dim`/`kv_heads`: this layer's where not the config's (Gemma 4's full layers); `v_norm`:
    values RMS-normed without a weight; `values_from_keys`: no v_proj, the values are k_proj's
    output before its norm and rotation (Gemma 4's `attention_k_eq_v`)."""

    takes_device_position = True  # a decode call may be captured in a CUDA graph (base.Mixer)
    chunks_prompt = True  # a long prompt may come in chunks: later ones read the earlier ones' keys (base.Mixer)

    def __init__(self, config: ModelConfig, weights: ModelWeights, prefix: str, rope: RotaryEmbedding,
                 dtype: torch.dtype, *, qk_norm: bool, scale: float | None = None,
                 rotary: Rotary | None = apply_rotary, window: int | None = None, sinks: torch.Tensor | None = None,
                 norm_names: tuple[str, str] = ("q_norm", "k_norm"), out_name: str = "o_proj",
                 head_dim: int | None = None, kv_heads: int | None = None, v_norm: bool = False,
                 values_from_keys: bool = False,
                 query_scale: Callable[[torch.Tensor], torch.Tensor] | None = None) -> None:
        projections = ("q_proj", "k_proj", "v_proj", out_name)
        self.q, self.k, self.o = (weights.get(f"{prefix}{p}.weight") for p in ("q_proj", "k_proj", out_name))
        self.v: torch.Tensor | None = None if values_from_keys else weights.get(f"{prefix}v_proj.weight")
        # attention_bias: q, k, v and o each have one (transformers' Qwen3MoeAttention)
        self.q_bias, self.k_bias, self.v_bias, self.o_bias = (weights.maybe(f"{prefix}{p}.bias") for p in projections)
        self.q_norm, self.k_norm = (weights.get(f"{prefix}{name}.weight") if qk_norm else None for name in norm_names)
        self.heads = config.num_attention_heads
        self.kv_heads = config.num_key_value_heads if kv_heads is None else kv_heads
        self.head_dim = config.head_dim if head_dim is None else head_dim
        self.v_norm = v_norm
        self.eps, self.rope, self.dtype, self.rotary, self.window = config.rms_norm_eps, rope, dtype, rotary, window
        self.scale = self.head_dim ** -0.5 if scale is None else scale  # (Granite's attention_multiplier)
        self.sinks, self.query_scale = sinks, query_scale

    def new_cache(self, max_tokens: int) -> KVCache:
        return KVCache(max_tokens, self.kv_heads, self.head_dim, self.head_dim, self.dtype)

    def __call__(self, x: torch.Tensor, positions: torch.Tensor, cache: KVCache, start: Start) -> torch.Tensor:
        return linear(self.attend(x, positions, cache, start), self.o, self.o_bias)

    def attend(self, x: torch.Tensor, positions: torch.Tensor, cache: KVCache, start: Start) -> torch.Tensor:
        """The attended values before the output projection, [T, heads x head_dim] (a gated
        attention weighs them first)."""
        t = x.shape[0]
        q = linear(x, self.q, self.q_bias).view(t, self.heads, self.head_dim)  # [T, Hq, D]
        k = linear(x, self.k, self.k_bias).view(t, self.kv_heads, self.head_dim)  # [T, Hkv, D]
        v = k if self.v is None else linear(x, self.v, self.v_bias).view(t, self.kv_heads, self.head_dim)
        if self.v_norm:
            v = l2_norm(v, self.eps)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = rms_norm(q, self.q_norm, self.eps), rms_norm(k, self.k_norm, self.eps)
        if self.rotary is not None:
            cos, sin = self.rope(positions, x.dtype)
            q, k = self.rotary(q, cos, sin), self.rotary(k, cos, sin)
        if self.query_scale is not None:
            q = (q.to(torch.float32) * self.query_scale(positions)[:, None, None]).to(q.dtype)
        keys, values = cache.append(start, k, v)
        if self.sinks is not None:
            out = sink_causal_attention(q, keys, values, start, self.scale, self.sinks, self.window)
        elif self.window is None:
            out = causal_attention(q, keys, values, start, self.scale)
        else:
            out = sliding_causal_attention(q, keys, values, start, self.scale, self.window)
        return out.reshape(t, self.heads * self.head_dim)


class SoftmaxMoE:
    """Router (softmax top-k) + routed experts through the executor."""

    def __init__(self, config: ModelConfig, weights: ModelWeights, layer: int, router: str,
                 executor: ExpertExecutor, *, normalize: bool) -> None:
        self.router = weights.get(router)
        self.layer, self.executor = layer, executor
        self.k, self.normalize = config.num_experts_per_tok, normalize

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        ids, weights = softmax_topk(linear(x, self.router), self.k, self.normalize)
        return self.executor(self.layer, x, ids, weights.to(x.dtype))


def dense_mlp(weights: ModelWeights, prefix: str) -> FFN:
    gate, up, down = (weights.get(f"{prefix}{p}_proj.weight") for p in ("gate", "up", "down"))
    return lambda x: swiglu_mlp(x, gate, up, down)


def gqa_moe_model(config: ModelConfig, weights: ModelWeights, dtype: torch.dtype, *, name: str, qk_norm: bool,
                  moe: Callable[[int, str], FFN]) -> DecoderModel:
    """The Qwen-style block: GQA attention (full RoPE), then `moe(layer, "model.layers.N.mlp.")`
    on the MoE layers and a dense SwiGLU MLP on the others (`mlp_only_layers`)."""
    if config.get("use_sliding_window") and config.get("sliding_window"):
        raise UnsupportedFamilyError(f"{name} with a sliding attention window (use_sliding_window) is not "
                                     "supported yet")
    rope = RotaryEmbedding(config.head_dim, config.rope_parameters, config.context_length)
    blocks = []
    for i in range(config.num_layers):
        p = f"model.layers.{i}."
        ffn = moe(i, p + "mlp.") if i in config.moe_layers else dense_mlp(weights, p + "mlp.")
        attention = GQAAttention(config, weights, p + "self_attn.", rope, dtype, qk_norm=qk_norm)
        blocks.append(Block(weights.get(p + "input_layernorm.weight"), attention,
                            weights.get(p + "post_attention_layernorm.weight"), ffn))
    return DecoderModel(config, weights, blocks, dtype)


def build(config: ModelConfig, weights: ModelWeights, executor: ExpertExecutor, dtype: torch.dtype) -> DecoderModel:
    normalize = bool(config.get("norm_topk_prob"))
    return gqa_moe_model(config, weights, dtype, name="Qwen3-MoE", qk_norm=True, moe=lambda layer, prefix: SoftmaxMoE(
        config, weights, layer, prefix + "gate.weight", executor, normalize=normalize))
