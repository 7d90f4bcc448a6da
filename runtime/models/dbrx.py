"""DBRX (dbrx): GQA attention from one fused `Wqkv` projection, all of it clipped to
±`attn_config.clip_qkv`; LayerNorms without biases (nn.LayerNorm's eps, 1e-5); every layer a
softmax top-k MoE whose k weights are divided by their p-norm (`moe_normalize_expert_weights`).

The names are DBRX's own: transformer.wte, transformer.blocks.N.norm_attn_norm.{norm_1, attn,
norm_2}, transformer.blocks.N.ffn.router.layer, transformer.norm_f. Its experts are one flat
tensor per projection and layer (`ffn.experts.mlp.w1`, `v1`, `w2`, each [E * I, H]), which the
converter reshapes into FTW's w13/w2 (ftw/families.py, ftw/convert.py).

RoPE's base is `attn_config.rope_theta`: the only place the released config sets it (500000),
and the one DBRX's own code and transformers 4 read. transformers 5 reads a top-level
`rope_parameters` only, so it runs the released checkpoints at its default base of 10000; a
config without attn_config.rope_theta takes the top-level one here too.
"""

from __future__ import annotations

import torch

from ..config import ModelConfig, UnsupportedFamilyError
from ..experts import ExpertExecutor
from ..layers.attention import KVCache, Start, causal_attention
from ..layers.linear import linear
from ..layers.mlp import softmax_topk_pnorm
from ..layers.norm import LayerNorm
from ..layers.rope import RotaryEmbedding, apply_rotary
from ..loading.read_ftw import ModelWeights
from .base import Block, DecoderModel

LAYER_NORM_EPS = 1e-5  # nn.LayerNorm's default: DBRX's norms set none


class FusedQKVAttention:
    """Wqkv (queries, keys, values in one matrix), clipped; RoPE, causal attention, out_proj."""

    takes_device_position = True  # (base.Mixer: as GQAAttention)
    chunks_prompt = True

    def __init__(self, config: ModelConfig, weights: ModelWeights, prefix: str, rope: RotaryEmbedding,
                 dtype: torch.dtype) -> None:
        self.qkv, self.o = weights.get(prefix + "Wqkv.weight"), weights.get(prefix + "out_proj.weight")
        self.heads, self.kv_heads, self.head_dim = config.num_attention_heads, config.num_key_value_heads, config.head_dim
        clip = (config.get("attn_config") or {}).get("clip_qkv")
        self.clip = None if clip is None else float(clip)
        self.rope, self.dtype, self.scale = rope, dtype, self.head_dim ** -0.5

    def new_cache(self, max_tokens: int) -> KVCache:
        return KVCache(max_tokens, self.kv_heads, self.head_dim, self.head_dim, self.dtype)

    def __call__(self, x: torch.Tensor, positions: torch.Tensor, cache: KVCache, start: Start) -> torch.Tensor:
        t = x.shape[0]
        qkv = linear(x, self.qkv)  # [T, (Hq + 2 Hkv) D]
        if self.clip is not None:
            qkv = qkv.clamp(-self.clip, self.clip)
        q, k, v = qkv.split([self.heads * self.head_dim, self.kv_heads * self.head_dim, self.kv_heads * self.head_dim],
                            dim=-1)
        q = q.view(t, self.heads, self.head_dim)  # [T, Hq, D]
        k, v = k.view(t, self.kv_heads, self.head_dim), v.view(t, self.kv_heads, self.head_dim)  # [T, Hkv, D]
        cos, sin = self.rope(positions, x.dtype)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        keys, values = cache.append(start, k, v)
        out = causal_attention(q, keys, values, start, self.scale)
        return linear(out.reshape(t, self.heads * self.head_dim), self.o)


class PNormMoE:
    """Router (softmax top-k over p-normed weights) + routed experts through the executor."""

    def __init__(self, config: ModelConfig, weights: ModelWeights, layer: int, executor: ExpertExecutor) -> None:
        self.router = weights.get(f"transformer.blocks.{layer}.ffn.router.layer.weight")
        ffn = config.get("ffn_config") or {}
        # (DbrxFFNConfig's default where the key is left out; an explicit null normalizes nothing)
        p = ffn.get("moe_normalize_expert_weights", 1.0)
        self.p = None if p is None else float(p)
        self.layer, self.executor, self.k = layer, executor, config.num_experts_per_tok

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        ids, weights = softmax_topk_pnorm(linear(x, self.router), self.k, self.p)
        return self.executor(self.layer, x, ids, weights.to(x.dtype))


def rotary(config: ModelConfig) -> RotaryEmbedding:
    params = config.rope_parameters
    theta = (config.get("attn_config") or {}).get("rope_theta")
    if theta is not None:
        params["rope_theta"] = float(theta)
    return RotaryEmbedding(config.head_dim, params, config.context_length)


def build(config: ModelConfig, weights: ModelWeights, executor: ExpertExecutor, dtype: torch.dtype) -> DecoderModel:
    activation = ((config.get("ffn_config") or {}).get("ffn_act_fn") or {}).get("name", "silu")
    if activation != "silu":
        raise UnsupportedFamilyError(f"DBRX with ffn_act_fn {activation!r} is not supported (the expert kernels "
                                     "compute SiLU)")

    def layer_norm(name: str) -> LayerNorm:
        return LayerNorm(weights.get(name), None, LAYER_NORM_EPS)

    rope = rotary(config)
    blocks = []
    for i in range(config.num_layers):
        p = f"transformer.blocks.{i}.norm_attn_norm."
        attention = FusedQKVAttention(config, weights, p + "attn.", rope, dtype)
        blocks.append(Block(layer_norm(p + "norm_1.weight"), attention, layer_norm(p + "norm_2.weight"),
                            PNormMoE(config, weights, i, executor)))
    return DecoderModel(config, weights, blocks, dtype, prefix="transformer.", embed_name="wte.weight",
                        final_norm=layer_norm("transformer.norm_f.weight"))
