"""DeepSeek-V4 (V4-Flash, V4-Pro): compressed attention with a sliding window and sinks
(layers/compressed_attention.py: CSA layers with a lightning indexer, HCA layers), a residual of
`hc_mult` streams mixed around every sublayer (layers/hyper_connection.py), and an MoE on every
layer: sqrt-softplus scores, the first `num_hash_layers` choosing their experts by the token id
(`tid2eid`), the others by score + correction bias; always renormalized, one shared expert, and
routed and shared experts alike clamp gate and up at `swiglu_limit` (the banks' "swiglu_limited").

Configs come two ways, read as DeepseekV4Config reads them: transformers' (layer_types,
mlp_layer_types, compress_rates, rope_parameters {"main", "compress"}) and the release's
(compress_ratios per layer, num_hash_layers, qk_rope_head_dim, a flat rope_scaling for the
compressed layers' YaRN). Sliding layers rotate with `rope_theta`, the others with
`compress_rope_theta` (and the YaRN, its cos/sin unscaled: attention_factor 1).
"""

from __future__ import annotations

from typing import Any

import torch

from ..config import ModelConfig, UnsupportedFamilyError
from ..experts import ExpertExecutor
from ..layers.compressed_attention import (
    CSA,
    HCA,
    LAYER_TYPES,
    SLIDING,
    CompressedAttention,
    CompressedAttentionConfig,
)
from ..layers.hyper_connection import HyperConnection, HyperHead
from ..layers.linear import linear
from ..layers.mlp import SCORE_FUNCTIONS, biased_topk, renormalized_choice, swiglu_mlp
from ..layers.norm import Float32RMSNorm
from ..layers.rope import RotaryEmbedding
from ..loading.read_ftw import ModelWeights
from .base import Block, DecoderModel

# DeepseekV4Config's defaults, for checkpoints whose config.json leaves a key out
DEFAULTS: dict[str, Any] = dict(
    compress_rates={CSA: 4, HCA: 128}, num_hash_layers=3, partial_rotary_factor=64 / 512, hc_mult=4,
    hc_sinkhorn_iters=20, hc_eps=1e-6, swiglu_limit=10.0, sliding_window=128, o_groups=8, index_n_heads=64,
    index_head_dim=128, index_topk=512, scoring_func="sqrtsoftplus", routed_scaling_factor=1.5,
    rope_theta=10000.0, compress_rope_theta=160000.0)
COMPRESS_RATIO_LAYER_TYPES = {0: SLIDING, 4: CSA, 128: HCA}  # the release's compress_ratios

# transformers keeps these in float32 (_keep_in_fp32_modules_strict): the norms, the hyper-connections,
# the sinks, the compressors' position biases and the correction bias
KEEP_FLOAT32 = ("norm.weight", "_hc.fn", "_hc.base", "_hc.scale", "hc_head.hc_fn", "hc_head.hc_base",
                "hc_head.hc_scale", "sinks", "position_bias", "e_score_correction_bias")


def get(config: ModelConfig, key: str) -> Any:
    return config.get(key, DEFAULTS[key])


def layer_types(config: ModelConfig) -> list[str]:
    """The attention kind of every layer: `layer_types`, else the release's `compress_ratios`, else
    DeepseekV4Config's schedule (two HCA layers, then CSA and HCA alternating)."""
    n = config.num_layers
    types = config.get("layer_types")
    if types is None and config.get("compress_ratios") is not None:
        ratios = list(config.get("compress_ratios"))
        unknown = sorted({r for r in ratios if r not in COMPRESS_RATIO_LAYER_TYPES})
        if unknown:
            raise UnsupportedFamilyError(f"deepseek_v4 compress_ratios {unknown} are not ones the runtime runs "
                                         f"({', '.join(map(str, COMPRESS_RATIO_LAYER_TYPES))})")
        types = [COMPRESS_RATIO_LAYER_TYPES[r] for r in ratios]
    if types is None:
        types = [HCA] * min(n, 2) + [CSA if i % 2 else HCA for i in range(max(n - 2, 0))]
    types = list(types)[:n]
    if len(types) != n or any(t not in LAYER_TYPES for t in types):
        raise ValueError(f"deepseek_v4 layer_types {types} are not one of {', '.join(LAYER_TYPES)} per layer")
    return types


def hashed_layers(config: ModelConfig) -> list[bool]:
    """Whether each layer routes by the token id: `mlp_layer_types`, else the first `num_hash_layers`."""
    n = config.num_layers
    kinds = config.get("mlp_layer_types")
    if kinds is None:
        kinds = ["hash_moe"] * min(n, int(get(config, "num_hash_layers"))) + ["moe"] * n
    kinds = list(kinds)[:n]
    if len(kinds) != n or any(k not in ("hash_moe", "moe") for k in kinds):
        raise ValueError(f"deepseek_v4 mlp_layer_types {kinds} are not hash_moe or moe per layer")
    return [k == "hash_moe" for k in kinds]


def compress_rates(config: ModelConfig) -> dict[str, int]:
    rates = {**DEFAULTS["compress_rates"], **(config.get("compress_rates") or {})}
    for kind, key in ((CSA, "compress_rate_csa"), (HCA, "compress_rate_hca")):  # (legacy scalars)
        if config.get(key) is not None:
            rates[kind] = config.get(key)
    return {kind: int(rate) for kind, rate in rates.items()}


def rope_dim(config: ModelConfig) -> int:
    """The rotated channels of each head: head_dim x partial_rotary_factor (the release's
    qk_rope_head_dim / head_dim where that is what it gives)."""
    factor = config.get("partial_rotary_factor")
    if factor is None and config.get("qk_rope_head_dim") is not None:
        factor = int(config.get("qk_rope_head_dim")) / config.head_dim
    return int(config.head_dim * float(DEFAULTS["partial_rotary_factor"] if factor is None else factor))


def rope_parameters(config: ModelConfig) -> tuple[dict[str, Any], dict[str, Any]]:
    """(main, compress) rope parameters: nested in `rope_parameters` as transformers writes them, else
    made as DeepseekV4Config makes them from a flat one (the release's rope_scaling: its YaRN is the
    compressed layers', over compress_rope_theta, with attention_factor 1)."""
    nested = config.get("rope_parameters") or {}
    if isinstance(nested.get("main"), dict) and isinstance(nested.get("compress"), dict):
        return dict(nested["main"]), dict(nested["compress"])
    flat = {k: v for k, v in config.rope_parameters.items() if k not in ("main", "compress", "type")}
    main = {"rope_type": "default", "rope_theta": float(get(config, "rope_theta"))}
    compress = {**flat, "rope_theta": float(get(config, "compress_rope_theta"))}
    if compress.get("rope_type") == "yarn":
        compress.setdefault("attention_factor", 1.0)
    return main, compress


class HashOrScoredMoE:
    """The MoE of one layer: scores by `scoring_func`; experts chosen by `tid2eid[token]` (hash
    layers) or by score + e_score_correction_bias; weights renormalized, times
    routed_scaling_factor; routed experts through the executor (their bank's activation clamps),
    plus the shared expert with the same clamps."""

    takes_tokens = True  # called as ffn(x, tokens): hash routing reads the token ids (base.FFN)

    def __init__(self, config: ModelConfig, weights: ModelWeights, layer: int, executor: ExpertExecutor, *,
                 hashed: bool) -> None:
        p = f"model.layers.{layer}.mlp."
        scoring = str(get(config, "scoring_func"))
        if scoring not in SCORE_FUNCTIONS:
            raise UnsupportedFamilyError(f"deepseek_v4 scoring_func {scoring!r} is not supported yet "
                                         f"({', '.join(SCORE_FUNCTIONS)} are)")
        self.score = SCORE_FUNCTIONS[scoring]
        self.router = weights.get(p + "gate.weight")
        self.table = weights.get(p + "gate.tid2eid") if hashed else None  # [vocab, k] expert ids
        self.bias = None if hashed else weights.get(p + "gate.e_score_correction_bias")
        self.shared = tuple(weights.get(f"{p}shared_experts.{w}_proj.weight") for w in ("gate", "up", "down"))
        self.layer, self.executor, self.k = layer, executor, config.num_experts_per_tok
        self.scaling, self.limit = float(get(config, "routed_scaling_factor")), float(get(config, "swiglu_limit"))

    def __call__(self, x: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        scores = self.score(linear(x, self.router))  # (in x's dtype, as transformers routes)
        if self.table is not None:
            ids = self.table[tokens.to(self.table.device)].long()
            weights = renormalized_choice(scores, ids, self.scaling)
        else:
            assert self.bias is not None
            ids, weights = biased_topk(scores, self.bias, self.k, self.scaling)
        routed = self.executor(self.layer, x, ids, weights.to(x.dtype))
        gate, up, down = self.shared
        return routed + swiglu_mlp(x, gate, up, down, limit=self.limit)


def hyper_connection(config: ModelConfig, weights: ModelWeights, prefix: str) -> HyperConnection:
    return HyperConnection(weights.get(prefix + "fn"), weights.get(prefix + "base"), weights.get(prefix + "scale"),
                           int(get(config, "hc_mult")), int(get(config, "hc_sinkhorn_iters")),
                           float(get(config, "hc_eps")), config.rms_norm_eps)


def build(config: ModelConfig, weights: ModelWeights, executor: ExpertExecutor, dtype: torch.dtype) -> DecoderModel:
    if config.get("q_lora_rank") is None:
        raise ValueError("deepseek_v4 needs q_lora_rank: its queries and its indexer read the low-rank query")
    kinds, hashed, rates, rotated = layer_types(config), hashed_layers(config), compress_rates(config), rope_dim(config)
    main_params, compress_params = rope_parameters(config)
    main = RotaryEmbedding(rotated, main_params, config.context_length)
    compress = RotaryEmbedding(rotated, compress_params, config.context_length)
    eps, blocks = config.rms_norm_eps, []
    for i, kind in enumerate(kinds):
        p = f"model.layers.{i}."
        sizes = CompressedAttentionConfig(
            kind=kind, heads=config.num_attention_heads, head_dim=config.head_dim, rope_dim=rotated,
            window=int(get(config, "sliding_window")), o_groups=int(get(config, "o_groups")), rate=rates.get(kind, 0),
            index_heads=int(get(config, "index_n_heads")), index_head_dim=int(get(config, "index_head_dim")),
            index_topk=int(get(config, "index_topk")), eps=eps)
        attention = CompressedAttention(sizes, weights, p + "self_attn.", main if kind == SLIDING else compress, dtype)
        moe = HashOrScoredMoE(config, weights, i, executor, hashed=hashed[i])
        residuals = (hyper_connection(config, weights, p + "attn_hc."), hyper_connection(config, weights, p + "ffn_hc."))
        blocks.append(Block(Float32RMSNorm(weights.get(p + "input_layernorm.weight"), eps), attention,
                            Float32RMSNorm(weights.get(p + "post_attention_layernorm.weight"), eps), moe, residuals))
    head = HyperHead(weights.get("model.hc_head.hc_fn"), weights.get("model.hc_head.hc_base"),
                     weights.get("model.hc_head.hc_scale"), int(get(config, "hc_mult")), float(get(config, "hc_eps")),
                     eps)
    return DecoderModel(config, weights, blocks, dtype, final_norm=Float32RMSNorm(weights.get("model.norm.weight"), eps),
                        streams=head)
