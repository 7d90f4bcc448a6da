"""Llama 4 (llama4: Scout, Maverick), the text model. The vision tower and its projector are
dropped at conversion; the weights keep the released names, under `language_model.`.

Layers come in two kinds (`no_rope_layers`, `layer_types`): RoPE layers (interleaved pairs, Llama 3
frequency scaling) attend within chunks of `attention_chunk_size` positions and L2-normalize q and k
after the rotation (`use_qk_norm`); every `no_rope_layer_interval`-th layer has no positional
encoding (NoPE), attends to the whole context and scales its queries by a temperature that grows
with the position (`attn_temperature_tuning`). The MoE layers (`moe_layers`: every
`interleave_moe_layer_step`-th) send each token to its top-k experts by sigmoid score, the score
scaling the expert's input, beside a shared expert; the others are a dense SwiGLU of
`intermediate_size_mlp`.
"""

from __future__ import annotations

import torch

from ..config import ModelConfig
from ..experts import ExpertExecutor
from ..layers.attention import KVCache, Start, causal_attention, chunked_causal_attention
from ..layers.linear import linear
from ..layers.mlp import input_scaled_experts, sigmoid_topk
from ..layers.norm import l2_norm
from ..layers.rope import RotaryEmbedding, apply_rotary_interleaved, query_temperature
from ..loading.read_ftw import ModelWeights
from .base import FFN, Block, DecoderModel
from .qwen3_moe import GQAAttention, dense_mlp

PREFIX = "language_model.model."
HEAD = "language_model.lm_head.weight"

# Llama4TextConfig's defaults, for checkpoints whose config.json leaves a key out
DEFAULTS = dict(no_rope_layer_interval=4, attention_chunk_size=8192, use_qk_norm=True, attn_temperature_tuning=True,
                floor_scale=8192, attn_scale=0.1)


class Llama4Attention(GQAAttention):
    """GQA with RoPE, q/k L2 norm and chunked attention (`use_rope`), or NoPE with the query
    temperature and full causal attention; `chunk_size` None attends to every earlier token."""

    def __init__(self, config: ModelConfig, weights: ModelWeights, prefix: str, rope: RotaryEmbedding,
                 dtype: torch.dtype, *, use_rope: bool, chunk_size: int | None) -> None:
        super().__init__(config, weights, prefix, rope, dtype, qk_norm=False)
        self.use_rope, self.chunk_size = use_rope, chunk_size
        self.l2_qk = use_rope and bool(config.get("use_qk_norm", DEFAULTS["use_qk_norm"]))
        tuning = not use_rope and bool(config.get("attn_temperature_tuning", DEFAULTS["attn_temperature_tuning"]))
        self.temperature = (float(config.get("floor_scale", DEFAULTS["floor_scale"])),
                            float(config.get("attn_scale", DEFAULTS["attn_scale"]))) if tuning else None

    def __call__(self, x: torch.Tensor, positions: torch.Tensor, cache: KVCache, start: Start) -> torch.Tensor:
        t = x.shape[0]
        q = linear(x, self.q, self.q_bias).view(t, self.heads, self.head_dim)  # [T, Hq, D]
        k = linear(x, self.k, self.k_bias).view(t, self.kv_heads, self.head_dim)  # [T, Hkv, D]
        v = linear(x, self.v, self.v_bias).view(t, self.kv_heads, self.head_dim)
        if self.use_rope:
            # transformers rotates adjacent pairs (complex multiply); the de-interleaved result gives
            # q and k the same channel order, which neither the dot products nor the L2 norm see
            cos, sin = self.rope(positions, x.dtype)
            q, k = apply_rotary_interleaved(q, cos, sin), apply_rotary_interleaved(k, cos, sin)
            if self.l2_qk:
                q, k = l2_norm(q, self.eps), l2_norm(k, self.eps)
        elif self.temperature is not None:  # (arXiv 2501.19399): 1 + attn_scale * log(1 + floor((p + 1) / floor_scale))
            floor_scale, attn_scale = self.temperature
            scales = query_temperature(positions, floor_scale, attn_scale, offset=1.0)
            q = (q * scales[:, None, None]).to(q.dtype)
        keys, values = cache.append(start, k, v)
        if self.chunk_size is None:
            out = causal_attention(q, keys, values, start, self.scale)
        else:
            out = chunked_causal_attention(q, keys, values, start, self.scale, self.chunk_size)
        return linear(out.reshape(t, self.heads * self.head_dim), self.o, self.o_bias)


class Llama4MoE:
    """Router (sigmoid of the top-k logits, in the model's dtype as transformers has it) + routed
    experts on the token scaled by their score, through the executor + the shared expert."""

    def __init__(self, config: ModelConfig, weights: ModelWeights, layer: int, prefix: str,
                 executor: ExpertExecutor) -> None:
        self.router = weights.get(prefix + "router.weight")
        self.shared = dense_mlp(weights, prefix + "shared_expert.")
        self.layer, self.executor, self.k = layer, executor, config.num_experts_per_tok

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        ids, weights = sigmoid_topk(linear(x, self.router), self.k)
        routed = input_scaled_experts(lambda rows, i, w: self.executor(self.layer, rows, i, w), x, ids, weights)
        return self.shared(x) + routed


def rope_layers(config: ModelConfig) -> list[bool]:
    """Per layer, whether it has RoPE: `no_rope_layers` (1 rope, 0 NoPE), else Llama4TextConfig's
    default, every `no_rope_layer_interval`-th layer NoPE."""
    given = config.get("no_rope_layers")
    if given:
        flags = [bool(f) for f in given]
    else:
        interval = int(config.get("no_rope_layer_interval", DEFAULTS["no_rope_layer_interval"]))
        flags = [(i + 1) % interval != 0 for i in range(config.num_layers)]
    if len(flags) != config.num_layers:
        raise ValueError(f"no_rope_layers has {len(flags)} entries for {config.num_layers} layers")
    return flags


def chunk_sizes(config: ModelConfig, uses_rope: list[bool]) -> list[int | None]:
    """Per layer, the attention chunk of a "chunked_attention" layer (`layer_types`, else the RoPE
    layers where `attention_chunk_size` is set, as Llama4TextConfig derives them); None: full."""
    chunk = config.source.get("attention_chunk_size", DEFAULTS["attention_chunk_size"])  # (null: no chunks)
    types = config.get("layer_types") or [
        "chunked_attention" if rope and chunk is not None else "full_attention" for rope in uses_rope]
    if len(types) != config.num_layers or set(types) - {"chunked_attention", "full_attention"}:
        raise ValueError(f"unsupported Llama 4 layer_types {types!r} for {config.num_layers} layers")
    if "chunked_attention" in types and chunk is None:
        raise ValueError("layer_types has chunked_attention layers but attention_chunk_size is null")
    return [int(chunk) if kind == "chunked_attention" else None for kind in types]


def build(config: ModelConfig, weights: ModelWeights, executor: ExpertExecutor, dtype: torch.dtype) -> DecoderModel:
    rope = RotaryEmbedding(config.head_dim, config.rope_parameters, config.context_length)
    uses_rope = rope_layers(config)
    blocks = []
    for i, chunk in enumerate(chunk_sizes(config, uses_rope)):
        p = f"{PREFIX}layers.{i}."
        attention = Llama4Attention(config, weights, p + "self_attn.", rope, dtype, use_rope=uses_rope[i], chunk_size=chunk)
        ffn: FFN = (Llama4MoE(config, weights, i, p + "feed_forward.", executor) if i in config.moe_layers
                    else dense_mlp(weights, p + "feed_forward."))
        blocks.append(Block(weights.get(p + "input_layernorm.weight"), attention,
                            weights.get(p + "post_attention_layernorm.weight"), ffn))
    return DecoderModel(config, weights, blocks, dtype, prefix=PREFIX, head_name=HEAD)
