"""Gemma 4's MoE text model (gemma4_text; released as a gemma4 checkpoint around it: the 26B-A4B).

Attention in two kinds of layer, as `layer_types` says: sliding ones attend within
`sliding_window` positions, full ones to everything, wider (`global_head_dim`) and with their own
key-value heads, their values k_proj's own output where `attention_k_eq_v` (no v_proj). Queries
and keys RMS-normed per head, values without a weight, scores unscaled (the norms set their size),
each kind with its own RoPE: the sliding layers' whole head, the full ones' proportional (a
quarter of the frequencies turning, the others 0). Each sublayer is normed before and after. The
FFN is a dense GeGLU MLP and, beside it on the same residual, the MoE: routed by the residual RMS
-normed without a weight, times `router.scale` and 1/sqrt(hidden), softmax top-k renormalized and
times each chosen expert's `per_expert_scale`; the experts (GeGLU too) read the residual through
their own norm. Each of the two outputs is normed, their sum normed again; the residual stream is
then scaled by the layer's `layer_scalar`. Embeddings times sqrt(hidden_size), logits soft-capped
at `final_logit_softcapping`.

Refused: the dense Gemma 4 models (no MoE block: ftw.families), per-layer embeddings
(`hidden_size_per_layer_input`, the E2B/E4B models'), layers sharing another's KV
(`num_kv_shared_layers`) and bidirectional attention over text.
"""

from __future__ import annotations

import math

import torch

from ftw.families import gemma4_attention, gemma4_layer_types

from ..config import ModelConfig, UnsupportedFamilyError
from ..experts import ExpertExecutor
from ..layers.linear import linear
from ..layers.mlp import geglu_mlp, softmax_topk
from ..layers.norm import l2_norm, rms_norm
from ..layers.rope import ropes_by_layer_type
from ..loading.read_ftw import ModelWeights
from .base import Block, DecoderModel
from .flex_olmo import PostNormedMixer, unnormed
from .qwen3_moe import GQAAttention

# Gemma4TextConfig's defaults, for a config.json that leaves a key out
DEFAULTS = dict(sliding_window=512)
ROPE_DEFAULTS = {"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                 "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1000000.0}}


class DenseAndMoE:
    """The FFN of a Gemma 4 layer, called on the residual x [T, H] (the block norms nothing before
    it): post_ffn(post_1(mlp(pre(x))) + post_2(experts(pre_2(x), routed by x)))."""

    def __init__(self, config: ModelConfig, weights: ModelWeights, layer: int, prefix: str,
                 executor: ExpertExecutor) -> None:
        self.gate, self.up, self.down = (weights.get(f"{prefix}mlp.{p}_proj.weight") for p in ("gate", "up", "down"))
        norms = ("pre_feedforward_layernorm", "post_feedforward_layernorm_1", "pre_feedforward_layernorm_2",
                 "post_feedforward_layernorm_2", "post_feedforward_layernorm")
        self.pre, self.post_mlp, self.pre_moe, self.post_moe, self.post = (weights.get(f"{prefix}{n}.weight")
                                                                           for n in norms)
        self.router, self.router_scale = weights.get(prefix + "router.proj.weight"), weights.get(prefix + "router.scale")
        self.expert_scale = weights.get(prefix + "router.per_expert_scale")
        self.layer, self.executor, self.k, self.eps = layer, executor, config.num_experts_per_tok, config.rms_norm_eps
        self.root = config.hidden_size ** -0.5

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        dense = rms_norm(geglu_mlp(rms_norm(x, self.pre, self.eps), self.gate, self.up, self.down), self.post_mlp, self.eps)
        ids, weights = softmax_topk(linear(l2_norm(x, self.eps) * self.router_scale * self.root, self.router), self.k, True)
        weights = weights * self.expert_scale[ids]  # [T, k] (float32)
        routed = self.executor(self.layer, rms_norm(x, self.pre_moe, self.eps), ids, weights.to(x.dtype))
        return rms_norm(dense + rms_norm(routed, self.post_moe, self.eps), self.post, self.eps)


def check_supported(config: ModelConfig) -> None:
    if config.get("hidden_size_per_layer_input"):
        raise UnsupportedFamilyError("gemma4_text with per-layer embeddings (hidden_size_per_layer_input, the "
                                     "E2B/E4B models') is not supported")
    if config.get("num_kv_shared_layers"):
        raise UnsupportedFamilyError("gemma4_text with layers sharing another's KV (num_kv_shared_layers) is not "
                                     "supported")
    if config.get("use_bidirectional_attention") == "all":
        raise UnsupportedFamilyError("gemma4_text with bidirectional attention (use_bidirectional_attention "
                                     "'all') is not supported: ft generates causally")
    if config.get("hidden_activation", "gelu_pytorch_tanh") != "gelu_pytorch_tanh":
        raise UnsupportedFamilyError(f"gemma4_text with hidden_activation {config.get('hidden_activation')!r} "
                                     "is not supported")


def build(config: ModelConfig, weights: ModelWeights, executor: ExpertExecutor, dtype: torch.dtype) -> DecoderModel:
    check_supported(config)
    source = dict(config.source)
    types, sizes = gemma4_layer_types(source), gemma4_attention(source)
    full_dim = next((size[2] for size, kind in zip(sizes, types, strict=True) if kind == "full_attention"), None)
    ropes = ropes_by_layer_type(config, types, ROPE_DEFAULTS, "gemma4_text",
                                head_dims={"full_attention": full_dim} if full_dim is not None else None)
    window = int(config.get("sliding_window", DEFAULTS["sliding_window"]))
    values_from_keys = bool(config.get("attention_k_eq_v"))
    blocks = []
    for i, (kind, (_, kv_heads, head_dim, _)) in enumerate(zip(types, sizes, strict=True)):
        p = f"model.layers.{i}."
        sliding = kind == "sliding_attention"
        attention = GQAAttention(config, weights, p + "self_attn.", ropes[kind], dtype, qk_norm=True, scale=1.0,
                                 window=window if sliding else None, head_dim=head_dim, kv_heads=kv_heads,
                                 v_norm=True, values_from_keys=values_from_keys and not sliding)
        blocks.append(Block(weights.get(p + "input_layernorm.weight"),
                            PostNormedMixer(attention, weights.get(p + "post_attention_layernorm.weight"),
                                            config.rms_norm_eps),
                            unnormed, DenseAndMoE(config, weights, i, p, executor),
                            output_scale=weights.get(p + "layer_scalar")))
    # (the scale rounded to the model's dtype first, as transformers' embed_scale buffer is cast)
    scale = float(torch.tensor(math.sqrt(config.hidden_size), dtype=dtype))
    softcap = config.get("final_logit_softcapping")
    return DecoderModel(config, weights, blocks, dtype, embedding_multiplier=scale,
                        final_logit_softcapping=float(softcap) if softcap else None)
