"""ERNIE 4.5 MoE (ernie4_5_moe): GQA attention without q/k norms whose RoPE rotates interleaved
channel pairs, in float32 (transformers' Ernie 4.5 `apply_rotary_pos_emb`); a dense SwiGLU MLP on
the layers before `moe_layer_start_index`, after `moe_layer_end_index` or off
`moe_layer_interval`, and on the others a softmax top-k MoE that chooses by score + correction
bias and weighs by the renormalized score, with the shared experts (one SwiGLU of
`moe_num_shared_experts` x `moe_intermediate_size`) added. The multi-token-prediction weights
(`model.mtp_*`) are dropped at conversion."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..config import ModelConfig, UnsupportedFamilyError
from ..experts import ExpertExecutor
from ..layers.attention import KVCache, Start, causal_attention
from ..layers.linear import linear
from ..layers.mlp import softmax_biased_topk
from ..layers.rope import RotaryEmbedding, apply_rotary_interleaved
from ..loading.read_ftw import ModelWeights
from .base import FFN, Block, DecoderModel
from .qwen3_moe import GQAAttention, dense_mlp

# Ernie4_5_MoeConfig's defaults, for checkpoints whose config.json leaves a key out
DEFAULTS = dict(moe_num_shared_experts=2, moe_norm_min=1e-12)

# transformers keeps these in float32 (_keep_in_fp32_modules_strict): routing must not see bf16-rounded values
KEEP_FLOAT32 = ("e_score_correction_bias", "mlp.gate.weight")


class InterleavedRotaryAttention(GQAAttention):
    """GQA attention whose RoPE rotates pairs (x0, x1), (x2, x3), ... of each head, in float32.

    `apply_rotary_interleaved` leaves the rotated channels de-interleaved; queries and keys get
    the same permutation, so their products, and the values attention weighs, are transformers'."""

    def __call__(self, x: torch.Tensor, positions: torch.Tensor, cache: KVCache, start: Start) -> torch.Tensor:
        t = x.shape[0]
        q = linear(x, self.q, self.q_bias).view(t, self.heads, self.head_dim)  # [T, Hq, D]
        k = linear(x, self.k, self.k_bias).view(t, self.kv_heads, self.head_dim)  # [T, Hkv, D]
        v = linear(x, self.v, self.v_bias).view(t, self.kv_heads, self.head_dim)
        cos, sin = self.rope(positions, torch.float32)
        q, k = (apply_rotary_interleaved(y.to(torch.float32), cos, sin).to(x.dtype) for y in (q, k))
        keys, values = cache.append(start, k, v)
        out = causal_attention(q, keys, values, start, self.scale)
        return linear(out.reshape(t, self.heads * self.head_dim), self.o, self.o_bias)


class BiasedSoftmaxMoE:
    """Router (float32 softmax; the top k by score + `e_score_correction_bias`) + routed experts
    through the executor + the shared experts added to their output."""

    def __init__(self, config: ModelConfig, weights: ModelWeights, layer: int, prefix: str,
                 executor: ExpertExecutor) -> None:
        self.router = weights.get(prefix + "gate.weight")
        # [1, E] as released; under the router where transformers >= 5 saves its own layout (fused experts)
        bias = weights.maybe(prefix + "moe_statics.e_score_correction_bias")
        if bias is None:
            bias = weights.get(prefix + "gate.moe_statics.e_score_correction_bias")
        self.bias = bias.reshape(-1)
        shared = int(config.get("moe_num_shared_experts", DEFAULTS["moe_num_shared_experts"]))
        self.shared = dense_mlp(weights, prefix + "shared_experts.") if shared else None
        self.layer, self.executor, self.k = layer, executor, config.num_experts_per_tok
        self.min_norm = float(config.get("moe_norm_min", DEFAULTS["moe_norm_min"]))

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        # transformers routes in float32 whatever the model dtype
        logits = F.linear(x.to(torch.float32), self.router.to(torch.float32))
        ids, weights = softmax_biased_topk(logits, self.bias, self.k, self.min_norm)
        routed = self.executor(self.layer, x, ids, weights.to(x.dtype))
        return routed if self.shared is None else routed + self.shared(x)


def build(config: ModelConfig, weights: ModelWeights, executor: ExpertExecutor, dtype: torch.dtype) -> DecoderModel:
    if config.get("use_bias"):
        raise UnsupportedFamilyError("ERNIE 4.5 with biases on its MLPs and head (use_bias) is not supported yet")
    rope = RotaryEmbedding(config.head_dim, config.rope_parameters, config.context_length)
    blocks = []
    for i in range(config.num_layers):
        p = f"model.layers.{i}."
        ffn: FFN = (BiasedSoftmaxMoE(config, weights, i, p + "mlp.", executor) if i in config.moe_layers
                    else dense_mlp(weights, p + "mlp."))
        attention = InterleavedRotaryAttention(config, weights, p + "self_attn.", rope, dtype, qk_norm=False)
        blocks.append(Block(weights.get(p + "input_layernorm.weight"), attention,
                            weights.get(p + "post_attention_layernorm.weight"), ffn))
    return DecoderModel(config, weights, blocks, dtype)
