"""Qwen3.5/3.6 MoE (text): a hybrid of Gated DeltaNet layers and gated full attention
(`layer_types`), every layer a softmax top-k MoE plus a sigmoid-gated shared expert.

All RMSNorms (input, post-attention, final, q/k) are zero-centred, (1 + w); only the DeltaNet's
output norm is plain. Weights live under `model.language_model.` (the vision tower is dropped at
conversion); positions are text-only, where M-RoPE's three position rows are equal and it reduces
to ordinary partial RoPE.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..config import ModelConfig
from ..experts import ExpertExecutor
from ..layers.attention import KVCache, Start, causal_attention
from ..layers.gated_deltanet import GatedDeltaNet
from ..layers.linear import linear
from ..layers.norm import rms_norm
from ..layers.rope import RotaryEmbedding, apply_rotary, partial_rotary
from ..loading.read_ftw import ModelWeights
from .base import FFN, Block, DecoderModel, Mixer
from .qwen3_moe import GQAAttention, SoftmaxMoE, dense_mlp

PREFIX = "model.language_model."


class GatedAttention(GQAAttention):
    """GQA with (1 + w) q/k norms (none where not `qk_norm`: MiniCPM5's), RoPE (partial in Qwen3.5), and
    the output gated by sigmoid of a second half of q_proj."""

    def __init__(self, config: ModelConfig, weights: ModelWeights, prefix: str, rope: RotaryEmbedding,
                 dtype: torch.dtype, *, qk_norm: bool = True) -> None:
        super().__init__(config, weights, prefix, rope, dtype, qk_norm=qk_norm)

    def __call__(self, x: torch.Tensor, positions: torch.Tensor, cache: KVCache, start: Start) -> torch.Tensor:
        t = x.shape[0]
        # q_proj interleaves per head: [q_h | gate_h] for each head h, not [all q | all gates]
        q, gate = linear(x, self.q, self.q_bias).view(t, self.heads, 2 * self.head_dim).chunk(2, dim=-1)
        k = linear(x, self.k, self.k_bias).view(t, self.kv_heads, self.head_dim)
        v = linear(x, self.v, self.v_bias).view(t, self.kv_heads, self.head_dim)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = rms_norm(q, self.q_norm, self.eps, offset=1.0), rms_norm(k, self.k_norm, self.eps, offset=1.0)
        cos, sin = self.rope(positions, x.dtype)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        keys, values = cache.append(start, k, v)
        out = causal_attention(q, keys, values, start, self.scale).reshape(t, self.heads * self.head_dim)
        return linear(out * torch.sigmoid(gate.reshape(t, -1)), self.o, self.o_bias)


class SharedExpertMoE:
    """Routed experts (top-k weights renormalized: always in Qwen3.5, whose transformers router
    divides by the top-k sum unconditionally; as `normalize` says in the families before it) +
    the shared expert times sigmoid(shared_expert_gate)."""

    def __init__(self, config: ModelConfig, weights: ModelWeights, layer: int, prefix: str,
                 executor: ExpertExecutor, *, normalize: bool = True) -> None:
        self.routed = SoftmaxMoE(config, weights, layer, prefix + "gate.weight", executor, normalize=normalize)
        self.shared = dense_mlp(weights, prefix + "shared_expert.")
        self.shared_gate = weights.get(prefix + "shared_expert_gate.weight")  # [1, H]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.routed(x) + torch.sigmoid(linear(x, self.shared_gate)) * self.shared(x)


def layer_types(config: ModelConfig) -> list[str]:
    """`layer_types`, or the older `full_attention_interval` (every n-th layer full attention)."""
    types = config.get("layer_types")
    if types is None:
        interval = int(config.get("full_attention_interval", 4))
        types = ["full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(config.num_layers)]
    if len(types) != config.num_layers or set(types) - {"linear_attention", "full_attention"}:
        raise ValueError(f"unsupported Qwen3.5 layer_types {types!r} for {config.num_layers} layers")
    return list(types)


def hybrid_model(config: ModelConfig, weights: ModelWeights, dtype: torch.dtype, *, prefix: str,
                 deltanet: Callable[[ModelConfig, ModelWeights, str, torch.dtype], GatedDeltaNet],
                 moe: Callable[[int, str], FFN]) -> DecoderModel:
    """The Qwen3.5-style hybrid under `prefix`: `deltanet` or gated full attention by `layer_types`,
    then `moe(layer, "...layers.N.mlp.")` on the MoE layers and a dense SwiGLU MLP on the others."""
    rope = partial_rotary(config, 0.25)  # transformers' default for these families
    blocks = []
    for i, kind in enumerate(layer_types(config)):
        p = f"{prefix}layers.{i}."
        mixer: Mixer = (deltanet(config, weights, p + "linear_attn.", dtype) if kind == "linear_attention"
                        else GatedAttention(config, weights, p + "self_attn.", rope, dtype))
        ffn = moe(i, p + "mlp.") if i in config.moe_layers else dense_mlp(weights, p + "mlp.")
        blocks.append(Block(weights.get(p + "input_layernorm.weight"), mixer,
                            weights.get(p + "post_attention_layernorm.weight"), ffn))
    return DecoderModel(config, weights, blocks, dtype, prefix=prefix, norm_offset=1.0)


def build(config: ModelConfig, weights: ModelWeights, executor: ExpertExecutor, dtype: torch.dtype) -> DecoderModel:
    return hybrid_model(config, weights, dtype, prefix=PREFIX, deltanet=GatedDeltaNet, moe=lambda layer, prefix: (
        SharedExpertMoE(config, weights, layer, prefix, executor)))
