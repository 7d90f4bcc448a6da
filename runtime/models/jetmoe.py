"""JetMoE (jetmoe): two mixtures a layer.

Attention is a mixture of attention heads (MoA): each token's router picks `num_experts_per_tok`
(k) of the attention experts, each a query projection [C, H] and an output projection [H, C]
(C = kv heads x kv_channels) over keys and values all of them share (`kv_proj`: keys, then
values). The k query groups attend as k x kv-heads heads, group i's head j reading key head j;
each group's output goes back through its expert's output projection, weighed by the router, and
the sum gets a bias. The attention experts are dense weights, not banks: every expert's query
projection runs for every token and the chosen ones are gathered, and the output projections run
over all experts with zeros where a token did not choose one (E/k times the chosen experts' flops,
one matmul each, and no host sync, so a decode step can be captured).

The FFN is a top-k MoE of SwiGLU experts, fused on disk as Granite's are (`mlp.input_linear`
[E, 2I, H], gate rows then up; `output_linear` [E, H, I]: FTW's w13/w2), plus a bias. Both
routers softmax the top-k logits. As transformers builds JetMoE, the layer norms keep RMSNorm's
default eps (1e-6) whatever `rms_norm_eps` says; only the final norm reads it.
"""

from __future__ import annotations

import torch

from ..config import ModelConfig, UnsupportedFamilyError
from ..experts import ExpertExecutor
from ..layers.attention import KVCache, Start, causal_attention
from ..layers.linear import linear
from ..layers.mlp import softmax_topk
from ..layers.norm import rms_norm
from ..layers.rope import RotaryEmbedding, apply_rotary
from ..loading.read_ftw import ModelWeights
from .base import Block, DecoderModel, Norm
from .qwen3_moe import SoftmaxMoE

BLOCK_NORM_EPS = 1e-6  # JetMoeRMSNorm's default, which transformers' layer norms keep


class MixtureOfAttention:
    """JetMoE's attention: routed query and output projections around shared keys and values."""

    takes_device_position = True  # a decode call may be captured in a CUDA graph (base.Mixer)
    chunks_prompt = True  # a long prompt may come in chunks: later ones read the earlier ones' keys (base.Mixer)

    def __init__(self, config: ModelConfig, weights: ModelWeights, prefix: str, rope: RotaryEmbedding,
                 dtype: torch.dtype) -> None:
        self.router = weights.get(prefix + "experts.router.layer.weight")  # [E, H]
        self.q = weights.get(prefix + "experts.input_linear.weight")  # [E, C, H]
        self.o = weights.get(prefix + "experts.output_linear.weight")  # [E, H, C]
        self.bias = weights.get(prefix + "experts.bias")  # [H]
        self.kv = weights.get(prefix + "kv_proj.weight")  # [2C, H]
        self.num_experts, self.k = self.q.shape[0], config.num_experts_per_tok
        self.kv_heads, self.head_dim = config.num_key_value_heads, config.head_dim
        self.rope, self.dtype = rope, dtype
        self.scale = self.head_dim ** -0.5

    def new_cache(self, max_tokens: int) -> KVCache:
        return KVCache(max_tokens, self.kv_heads, self.head_dim, self.head_dim, self.dtype)

    def __call__(self, x: torch.Tensor, positions: torch.Tensor, cache: KVCache, start: Start) -> torch.Tensor:
        t, e, k, heads, d = x.shape[0], self.num_experts, self.k, self.kv_heads, self.head_dim
        c = heads * d
        ids, gates = softmax_topk(linear(x, self.router), k, normalize=True)  # [T, k]
        chosen = ids[:, :, None].expand(t, k, c)
        q = linear(x, self.q.view(e * c, -1)).view(t, e, c).gather(1, chosen)  # [T, k, C]
        # query heads ordered by the key head they read, as causal_attention groups them: [T, Hkv * k, D]
        q = q.view(t, k, heads, d).transpose(1, 2).reshape(t, heads * k, d)
        keys, values = linear(x, self.kv).view(t, 2, heads, d).unbind(1)  # [T, Hkv, D] each
        cos, sin = self.rope(positions, x.dtype)
        q, keys = apply_rotary(q, cos, sin), apply_rotary(keys, cos, sin)
        keys, values = cache.append(start, keys, values)
        out = causal_attention(q, keys, values, start, self.scale)  # [T, Hkv * k, D]
        out = out.view(t, heads, k, d).transpose(1, 2).reshape(t, k, c)  # [T, k, C]: each chosen expert's
        routed = torch.zeros(t, e, c, dtype=x.dtype).scatter_(1, chosen, out * gates.to(x.dtype)[:, :, None])
        y = torch.bmm(routed.transpose(0, 1), self.o.transpose(1, 2)).sum(0)  # [E, T, C] @ [E, C, H] -> [T, H]
        return y + self.bias


class BiasedMoE:
    """The routed SwiGLU experts through the executor, plus the layer's bias."""

    def __init__(self, config: ModelConfig, weights: ModelWeights, layer: int, executor: ExpertExecutor) -> None:
        prefix = f"model.layers.{layer}.mlp."
        self.routed = SoftmaxMoE(config, weights, layer, prefix + "router.layer.weight", executor, normalize=True)
        self.bias = weights.get(prefix + "bias")

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.routed(x) + self.bias


class JetMoeDecoder(DecoderModel):
    """DecoderModel whose layer norms use BLOCK_NORM_EPS, the final norm `rms_norm_eps`."""

    def norm(self, x: torch.Tensor, weight: Norm) -> torch.Tensor:
        assert isinstance(weight, torch.Tensor)  # (RMSNorm weights only)
        return rms_norm(x, weight, self.eps if weight is self.final_norm else BLOCK_NORM_EPS)


def build(config: ModelConfig, weights: ModelWeights, executor: ExpertExecutor, dtype: torch.dtype) -> DecoderModel:
    if config.get("activation_function", "silu") != "silu":
        raise UnsupportedFamilyError(f"JetMoE with activation_function {config.get('activation_function')!r} is not "
                                     "supported (the expert kernels compute SiLU)")
    rope = RotaryEmbedding(config.head_dim, config.rope_parameters, config.context_length)
    blocks = []
    for i in range(config.num_layers):
        p = f"model.layers.{i}."
        attention = MixtureOfAttention(config, weights, p + "self_attention.", rope, dtype)
        blocks.append(Block(weights.get(p + "input_layernorm.weight"), attention,
                            weights.get(p + "post_attention_layernorm.weight"), BiasedMoE(config, weights, i, executor)))
    return JetMoeDecoder(config, weights, blocks, dtype)
