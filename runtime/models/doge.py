"""Doge (doge, SmallDoge's "Cross Domain MoE" models): GQA with per-head q/k RMSNorms and RoPE,
whose scores get a dynamic mask: each key adds exp(A * softplus(dt_proj(v))) of its own value
(one bias a key head, A a learned [Hkv]) and, where a query sees more than `keep_window_size`
keys, only that many of largest bias stay (layers/key_bias_attention.py; the bias is cached
beside the key). `sliding_window`, where set, bounds every layer.

The MoE (`is_moe`) is a SwiGLU MLP (`intermediate_size` wide, its weights right under `mlp.`) plus
retrieval experts chosen by product keys: the router gives 2 x sqrt(num_experts) logits, a half
for each of the two key sets; an expert i * K + j scores x_i + y_j, the top `num_experts_per_tok`
of all K^2 are taken, their scores softmaxed. Each expert is one neuron: silu(down_embed[e] . x)
times up_embed[e]. The converter stores them as a bank of non-gated silu experts one row wide
(down_embed as up_proj, up_embed as down_proj: ftw/families.py), so the executors run them.

The residual is learned per channel: x = input_residual * x + attention(norm(x)), and
post_attention_residual for the MLP (base.Block's `scales`).

Not as transformers' full forward pass: DogeCDMoE views the router's [T, 2K] logits as [2, T, K],
so in a call of several tokens token t's key halves come from tokens t // 2 and (T + t) // 2 (a
known bug transformers keeps for its checkpoints, which it says leaves token-by-token generation
unaffected). ft routes every token by its own logits, as transformers' one-token decode steps do:
its prompts' logits are those of transformers fed the prompt a token at a time.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ..config import ModelConfig, UnsupportedFamilyError
from ..experts import ExpertExecutor
from ..layers.attention import Start
from ..layers.key_bias_attention import KeyBiasCache, key_bias_causal_attention
from ..layers.linear import linear
from ..layers.norm import rms_norm
from ..layers.rope import RotaryEmbedding, whole_head_rope
from ..loading.read_ftw import ModelWeights
from .base import Block, DecoderModel
from .qwen3_moe import GQAAttention, dense_mlp

# DogeConfig's defaults, for a config.json that leaves a key out
DEFAULTS = dict(keep_window_size=2048, norm_topk_prob=False)


class DynamicMaskAttention(GQAAttention):
    """GQAAttention (q/k norms, RoPE) whose keys each carry exp(A * softplus(dt_proj(value))), added
    to their scores, and of which a query keeps the `keep` of largest bias."""

    def __init__(self, config: ModelConfig, weights: ModelWeights, prefix: str, rope: RotaryEmbedding,
                 dtype: torch.dtype, *, window: int | None, keep: int) -> None:
        super().__init__(config, weights, prefix, rope, dtype, qk_norm=True, window=window)
        self.dt, self.dt_bias = weights.get(prefix + "dt_proj.weight"), weights.maybe(prefix + "dt_proj.bias")
        self.a, self.keep = weights.get(prefix + "A"), keep

    def new_cache(self, max_tokens: int) -> KeyBiasCache:
        return KeyBiasCache(max_tokens, self.kv_heads, self.head_dim, self.head_dim, self.dtype)

    def attend(self, x: torch.Tensor, positions: torch.Tensor, cache: KeyBiasCache, start: Start) -> torch.Tensor:
        t = x.shape[0]
        q = rms_norm(linear(x, self.q, self.q_bias).view(t, self.heads, self.head_dim), self.q_norm, self.eps)
        k = rms_norm(linear(x, self.k, self.k_bias).view(t, self.kv_heads, self.head_dim), self.k_norm, self.eps)
        v = linear(x, self.v, self.v_bias).view(t, self.kv_heads, self.head_dim)  # [T, Hkv, D]
        cos, sin = self.rope(positions, x.dtype)
        q, k = self.rotary(q, cos, sin), self.rotary(k, cos, sin)
        bias = torch.exp(self.a * F.softplus(linear(v.reshape(t, -1), self.dt, self.dt_bias)))  # [T, Hkv]
        keys, values, biases = cache.append_biased(start, k, v, bias)
        out = key_bias_causal_attention(q, keys, values, biases, start, self.scale, window=self.window, keep=self.keep)
        return out.reshape(t, self.heads * self.head_dim)


class ProductKeyMoE:
    """The SwiGLU MLP + the experts product keys choose (softmax over the chosen scores; renormalized
    where `normalize`, which a softmax leaves as it is but for rounding), through the executor."""

    def __init__(self, config: ModelConfig, weights: ModelWeights, layer: int, prefix: str,
                 executor: ExpertExecutor, *, normalize: bool) -> None:
        self.router = weights.get(prefix + "router_gate.weight")  # [2K, H]
        self.keys = math.isqrt(config.num_experts)
        if self.router.shape[0] != 2 * self.keys:
            raise UnsupportedFamilyError(f"doge's router_gate has {self.router.shape[0]} rows, not 2 x "
                                         f"floor(sqrt({config.num_experts})) = {2 * self.keys}")
        self.mlp = dense_mlp(weights, prefix)
        self.layer, self.executor, self.k, self.normalize = layer, executor, config.num_experts_per_tok, normalize

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        t = x.shape[0]
        halves = linear(x, self.router).view(t, 2, self.keys)  # [T, 2, K]: each token's own two key sets
        scores = (halves[:, 0, :, None] + halves[:, 1, None, :]).view(t, self.keys * self.keys)  # expert i K + j
        top, ids = scores.topk(self.k, dim=-1)
        weights = F.softmax(top, dim=-1)
        if self.normalize:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return self.mlp(x) + self.executor(self.layer, x, ids, weights)


def build(config: ModelConfig, weights: ModelWeights, executor: ExpertExecutor, dtype: torch.dtype) -> DecoderModel:
    if config.get("hidden_act", "silu") != "silu":
        raise UnsupportedFamilyError("doge with another hidden_act than silu is not supported")
    if config.get("mlp_bias"):
        raise UnsupportedFamilyError("doge with mlp_bias is not supported (its experts' embeddings have no biases "
                                     "to hold them)")
    rope = whole_head_rope(config, "doge")
    window = config.get("sliding_window") or None
    keep = int(config.get("keep_window_size", DEFAULTS["keep_window_size"]))
    normalize = bool(config.get("norm_topk_prob", DEFAULTS["norm_topk_prob"]))
    blocks = []
    for i in range(config.num_layers):
        p = f"model.layers.{i}."
        attention = DynamicMaskAttention(config, weights, p + "self_attn.", rope, dtype, window=window, keep=keep)
        ffn = (ProductKeyMoE(config, weights, i, p + "mlp.", executor, normalize=normalize)
               if i in config.moe_layers else dense_mlp(weights, p + "mlp."))
        scales = ((weights.get(p + "input_residual"), 1.0), (weights.get(p + "post_attention_residual"), 1.0))
        blocks.append(Block(weights.get(p + "input_layernorm.weight"), attention,
                            weights.get(p + "post_attention_layernorm.weight"), ffn, scales=scales))
    return DecoderModel(config, weights, blocks, dtype)
