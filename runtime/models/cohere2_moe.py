"""Cohere Command A MoE (cohere2_moe): Cohere 2's parallel block, attention and the MLP side by
side on one norm of the residual (x += attn(h) + ffn(h)), that norm a LayerNorm without a bias
(an RMSNorm where the config gives `rms_norm_eps`). Attention is GQA in two kinds of layer, as
`layer_types` says: sliding ones rotate queries and keys (RoPE in interleaved pairs) and attend
within `sliding_window` positions, full ones attend to everything with no position encoding,
except the leading dense layers where `prefix_dense_sliding_window_pattern` is 1 (their full
attention rotates). Leading layers (`mlp_layer_types` "dense") run a SwiGLU MLP, the rest a
top-k MoE (softmax over the chosen logits, or their sigmoids, renormalized where
`norm_topk_prob`), with shared experts summed with the routed ones or averaged; logits times
`logit_scale`, the head tied to the embeddings by default."""

from __future__ import annotations

import torch

from ..config import ModelConfig, UnsupportedFamilyError
from ..experts import ExpertExecutor
from ..layers.linear import linear
from ..layers.mlp import sigmoid_topk, softmax_topk
from ..layers.norm import LayerNorm
from ..layers.rope import RotaryEmbedding, apply_rotary_interleaved
from ..loading.read_ftw import ModelWeights
from .base import FFN, Block, DecoderModel, Norm
from .qwen3_moe import GQAAttention, dense_mlp

# Cohere2MoeConfig's defaults, for checkpoints whose config.json leaves a key out
DEFAULTS = dict(sliding_window=4096, sliding_window_pattern=4, prefix_dense_sliding_window_pattern=1,
                num_shared_experts=0, shared_expert_combination_strategy="average", expert_selection_fn="softmax",
                norm_topk_prob=True, logit_scale=0.0625, layer_norm_eps=1e-5)


class CohereMoE:
    """Router (top-k logits; softmax over them, or their sigmoids renormalized where `normalize`)
    + routed experts through the executor + shared experts, summed or averaged with them."""

    def __init__(self, config: ModelConfig, weights: ModelWeights, layer: int, prefix: str,
                 executor: ExpertExecutor) -> None:
        def get(key: str):
            return config.get(key, DEFAULTS[key])

        self.router = weights.get(prefix + "gate.weight")
        self.layer, self.executor, self.k = layer, executor, config.num_experts_per_tok
        self.selection, self.normalize = str(get("expert_selection_fn")), bool(get("norm_topk_prob"))
        self.average = get("shared_expert_combination_strategy") == "average"
        if self.selection not in ("softmax", "sigmoid") or get("shared_expert_combination_strategy") not in ("sum", "average"):
            raise UnsupportedFamilyError(f"cohere2_moe with expert_selection_fn {self.selection!r} and shared experts "
                                         f"{get('shared_expert_combination_strategy')!r} is not supported")
        self.shared = dense_mlp(weights, prefix + "shared_experts.") if int(get("num_shared_experts")) > 0 else None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        logits = linear(x, self.router)
        if self.selection == "softmax":  # (softmax over the top k = softmax over all, renormalized)
            ids, weights = softmax_topk(logits, self.k, normalize=True)
        else:
            ids, weights = sigmoid_topk(logits, self.k)
            if self.normalize:
                weights = weights / weights.sum(dim=-1, keepdim=True)
        routed = self.executor(self.layer, x, ids, weights.to(x.dtype))
        if self.shared is None:
            return routed
        return (routed + self.shared(x)) / 2 if self.average else routed + self.shared(x)


def layer_types(config: ModelConfig, first_dense: int) -> list[str]:
    """`layer_types`, else Cohere2MoeConfig's schedule: the leading dense layers by
    `prefix_dense_sliding_window_pattern`, the rest by `sliding_window_pattern` (every n-th full)."""
    types = config.get("layer_types")
    if types is None:
        prefix = int(config.get("prefix_dense_sliding_window_pattern", DEFAULTS["prefix_dense_sliding_window_pattern"]))
        rest = int(config.get("sliding_window_pattern", DEFAULTS["sliding_window_pattern"]))
        types = (["sliding_attention" if (i + 1) % prefix else "full_attention" for i in range(first_dense)]
                 + ["sliding_attention" if (i + 1) % rest else "full_attention"
                    for i in range(config.num_layers - first_dense)])
    if len(types) != config.num_layers or set(types) - {"sliding_attention", "full_attention"}:
        raise UnsupportedFamilyError(f"unsupported cohere2_moe layer_types {types!r} for {config.num_layers} layers")
    return list(types)


def build(config: ModelConfig, weights: ModelWeights, executor: ExpertExecutor, dtype: torch.dtype) -> DecoderModel:
    if config.get("hidden_act", "silu") != "silu":
        raise UnsupportedFamilyError(f"cohere2_moe with hidden_act {config.get('hidden_act')!r} is not supported "
                                     "(the expert kernels compute SiLU)")
    dense = [i for i in range(config.num_layers) if i not in config.moe_layers]
    first_dense = int(config.get("first_k_dense_replace", 0))
    types = layer_types(config, first_dense)
    window = config.source.get("sliding_window", DEFAULTS["sliding_window"])  # (null: none)
    prefix_pattern = int(config.get("prefix_dense_sliding_window_pattern", DEFAULTS["prefix_dense_sliding_window_pattern"]))
    rope = RotaryEmbedding(config.head_dim, config.rope_parameters, config.context_length)

    def norm(name: str) -> Norm:
        if config.get("rms_norm_eps") is not None:
            return weights.get(name)
        return LayerNorm(weights.get(name), None, float(config.get("layer_norm_eps", DEFAULTS["layer_norm_eps"])))

    blocks = []
    for i, kind in enumerate(types):
        p = f"model.layers.{i}."
        layer_window = window if kind == "sliding_attention" else None
        rotates = layer_window is not None or (i in dense and prefix_pattern == 1)
        # RoPE in interleaved pairs, Cohere's rotate_half (the pairs come out de-interleaved, q and k
        # alike: their products are the same); no q/k norms
        attention = GQAAttention(config, weights, p + "self_attn.", rope, dtype, qk_norm=False, window=layer_window,
                                 rotary=apply_rotary_interleaved if rotates else None)
        ffn: FFN = CohereMoE(config, weights, i, p + "mlp.", executor) if i in config.moe_layers else (
            dense_mlp(weights, p + "mlp."))
        blocks.append(Block(norm(p + "input_layernorm.weight"), attention, norm(p + "input_layernorm.weight"), ffn,
                            parallel=True))
    return DecoderModel(config, weights, blocks, dtype, final_norm=norm("model.norm.weight"),
                        logits_scaling=1.0 / float(config.get("logit_scale", DEFAULTS["logit_scale"])))
