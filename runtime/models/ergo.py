"""Amazon Ergo (ergo): GQA from one fused `qkv_proj` (queries' rows, then keys', then values'), per-head
q/k RMSNorms, head_dim = hidden_size / heads, in two kinds of layer as `layer_types` says
(ErgoConfig's: every `global_attention_every_n_layers`-th full, the rest sliding): sliding ones rotate
(RoPE in interleaved pairs, Cohere's) and attend within `sliding_window` positions; full ones attend
to everything without position encoding (NoPE), their scores times `global_attention_scale` where
set. Sandwich norms (post_attention_layernorm, pre/post_feedforward_layernorm) and learned residual
gates: each sublayer joins as x * sqrt(1 + sigmoid(w)) exp(-softplus(w) / 2) + out * sigmoid(w), w [H]
one a layer and sublayer (base.Block's `scales`).

The first `num_dense_blocks` layers (or `mlp_layer_types`) are a dense relu2 MLP, the rest a MoE:
float32 router logits, sigmoid scores, the top k by score + correction bias, renormalized and times
`moe_routed_scaling_factor`; relu2 experts, not gated, each route's output RMSNormed with its
expert's own weight before the weighted sum (layers/mlp.output_normed_experts); plus one shared
relu2 expert, its output RMSNormed too.

The release's names (tok_embeddings, attention.wqkv, feed_forward.gate_kernel [H, E], ...) are
renamed and its router and shared expert transposed at conversion, as transformers'
conversion_mapping does (ftw/families.py). Its norms multiply by their float32 weight before the
cast back (Float32RMSNorm here; the post-attention and q/k norms the shared rms_norm, a rounding
apart in 16 bits). Where ft is not Ergo in 16 bits: Ergo keeps the residual stream, embeddings and
norm weights in float32 beside bf16 branches, ft the stream in the compute dtype; Ergo computes its
rope angles in float64, ft in float32 (apart at positions far into a long context): the same in
float32 at the positions the tests reach.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..config import ModelConfig, UnsupportedFamilyError
from ..experts import ExpertExecutor
from ..layers.mlp import output_normed_experts, sigmoid_group_topk
from ..layers.norm import Float32RMSNorm
from ..layers.rope import RotaryEmbedding, apply_rotary_interleaved
from ..loading.read_ftw import ModelWeights
from .base import FFN, Block, DecoderModel, ResidualScale
from .flex_olmo import PostNormedMixer
from .layer_schedule import layer_types as checked_layer_types
from .nemotron_h import relu2_mlp
from .qwen3_moe import GQAAttention
from .sarvam_moe import split_qkv

# ErgoConfig's defaults, for a config.json that leaves a key out
DEFAULTS = dict(sliding_window=512, global_attention_every_n_layers=4, num_dense_blocks=1,
                moe_routed_scaling_factor=8 ** 0.5, rope_theta=1_000_000.0)

# transformers keeps these in float32 (_keep_in_fp32_modules_strict): routing, the experts' norms and
# the residual gates must not see bf16-rounded values
KEEP_FLOAT32 = ("mlp.gate.linear.weight", "e_score_correction_bias", "post_expert_norm.weight", "residual_gate.weight")


class NormedExpertsMoE:
    """Router (float32: sigmoid scores, the top k by score + correction bias, renormalized, times the
    scale) + relu2 experts, each route's output RMSNormed with its expert's weight, weighed and
    summed + the shared expert's RMSNormed output."""

    def __init__(self, config: ModelConfig, weights: ModelWeights, layer: int, prefix: str,
                 executor: ExpertExecutor) -> None:
        self.router = weights.get(prefix + "gate.linear.weight")
        self.bias = weights.get(prefix + "gate.e_score_correction_bias")
        self.norms = weights.get(prefix + "experts.post_expert_norm.weight")  # [E, H]
        shared, shared_norm = relu2_mlp(weights, prefix + "shared_experts."), Float32RMSNorm(
            weights.get(prefix + "shared_experts.norm.weight"), config.rms_norm_eps)
        self.shared = lambda x: shared_norm(shared(x))
        self.layer, self.executor, self.k, self.eps = layer, executor, config.num_experts_per_tok, config.rms_norm_eps
        self.scaling = float(config.get("moe_routed_scaling_factor", DEFAULTS["moe_routed_scaling_factor"]))

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        # (transformers rounds the router weight to the branch dtype, then multiplies in float32)
        logits = F.linear(x.to(torch.float32), self.router.to(x.dtype).to(torch.float32))
        ids, weights = sigmoid_group_topk(logits, self.bias, self.k, 1, 1, True, self.scaling)
        routed = output_normed_experts(lambda rows, i, w: self.executor(self.layer, rows, i, w), x, ids,
                                       weights.to(x.dtype).to(torch.float32), self.norms, self.eps)
        return routed + self.shared(x)


def residual_gate(w: torch.Tensor, dtype: torch.dtype) -> ResidualScale:
    """(residual, update) of ErgoResidualGate's weight w [H]: sqrt(1 + sigmoid(w)) exp(-softplus(w) / 2)
    and sigmoid(w), computed in float32."""
    w = w.to(torch.float32)
    branch = torch.sigmoid(w)
    return (torch.sqrt(1.0 + branch) * torch.exp(-0.5 * F.softplus(w))).to(dtype), branch.to(dtype)


def layer_types(config: ModelConfig) -> list[str]:
    """`layer_types`, else ErgoConfig's: every `global_attention_every_n_layers`-th layer full."""
    every = int(config.get("global_attention_every_n_layers", DEFAULTS["global_attention_every_n_layers"]))
    return checked_layer_types(config, "ergo", lambda i: "sliding_attention" if (i + 1) % every else "full_attention")


def sliding_rope(config: ModelConfig) -> dict:
    """The sliding layers' rope parameters: `rope_parameters` keyed by layer type (the full layers'
    null), or flat as the release writes them (ErgoConfig reads those as the sliding layers')."""
    params = config.get("rope_parameters") or {"rope_type": "default", "rope_theta": DEFAULTS["rope_theta"]}
    if "rope_type" in params or "rope_theta" in params:
        params = {"sliding_attention": params, "full_attention": None}
    if set(params) != {"sliding_attention", "full_attention"} or params["full_attention"] is not None:
        raise UnsupportedFamilyError(f"ergo with rope_parameters {str(params)[:80]} is not supported (sliding layers "
                                     "rotate, full layers are NoPE)")
    sliding = {"rope_type": "default", "rope_theta": DEFAULTS["rope_theta"], **params["sliding_attention"]}
    if sliding["rope_type"] != "default" or float(sliding.get("partial_rotary_factor", 1.0)) != 1.0:
        raise UnsupportedFamilyError(f"ergo with {sliding['rope_type']!r} rope or a partial_rotary_factor is not "
                                     "supported (ft rotates whole heads at default frequencies)")
    return sliding


def build(config: ModelConfig, weights: ModelWeights, executor: ExpertExecutor, dtype: torch.dtype) -> DecoderModel:
    types = layer_types(config)
    rope = RotaryEmbedding(config.head_dim, sliding_rope(config), config.context_length)
    window = int(config.get("sliding_window", config.get("local_attention_window", DEFAULTS["sliding_window"])))
    global_scale = config.get("global_attention_scale")
    weights = split_qkv(config, weights, "qkv_proj")
    eps = config.rms_norm_eps

    def norm(name: str) -> Float32RMSNorm:
        return Float32RMSNorm(weights.get(name), eps)

    blocks = []
    for i, kind in enumerate(types):
        p, sliding = f"model.layers.{i}.", kind == "sliding_attention"
        scale = None if sliding or global_scale is None else config.head_dim ** -0.5 * float(global_scale)
        attention = GQAAttention(config, weights, p + "self_attn.", rope, dtype, qk_norm=True, scale=scale,
                                 rotary=apply_rotary_interleaved if sliding else None, window=window if sliding else None)
        mlp = NormedExpertsMoE(config, weights, i, p + "mlp.", executor) if i in config.moe_layers else (
            relu2_mlp(weights, p + "mlp."))
        post_ffn = norm(p + "post_feedforward_layernorm.weight")
        ffn: FFN = lambda x, mlp=mlp, post_ffn=post_ffn: post_ffn(mlp(x))  # noqa: E731
        blocks.append(Block(norm(p + "input_layernorm.weight"),
                            PostNormedMixer(attention, weights.get(p + "post_attention_layernorm.weight"), eps),
                            norm(p + "pre_feedforward_layernorm.weight"), ffn,
                            scales=(residual_gate(weights.get(p + "attention_residual_gate.weight"), dtype),
                                    residual_gate(weights.get(p + "feedforward_residual_gate.weight"), dtype))))
    return DecoderModel(config, weights, blocks, dtype, final_norm=norm("model.norm.weight"))
