"""Tencent Hy4 (hy_v4): GLM-5's sparse MLA (glm_moe_dsa.py: multi-head latent attention whose
queries see only the `index_topk` tokens a light indexer selects; "shared" layers reuse the last
"full" layer's selection, as `indexer_types` says, else HYV4Config's schedule: full on layer 0
and every fourth from layer 1) with three changes in attention, each a shared piece:

- a learned sink logit per head in every query's softmax (DSAttention's `sinks`,
  layers/sink_attention.sink_masked_attention over the selection);
- the attended values times sigmoid(gate_proj x) per head before o_proj (layers/mla.OutputGatedMLA);
- the indexer's rotated channels last in each head (GLM's come first), its k_norm a float32
  LayerNorm at rms_norm_eps (glm_moe_dsa.Indexer's `rope_last`, `norm_eps`).

The residual is `hc_mult` streams joined around each sublayer by independent hyper-connections
(layers/hyper_connection.IndependentHyperConnection: DeepSeek-V4's without the stream mixing,
`post` times hc_magnitude) and collapsed by DeepSeek-V4's head (HyperHead) before the final norm.
Feed-forward: a dense SwiGLU MLP where `mlp_layer_types` says "dense" (the first layer by
default), elsewhere DeepSeek-V3's MoE (deepseek_v3.SigmoidMoE): a float32 router's sigmoid
scores, the top k by score + correction bias (group-limited where n_group > 1), renormalized,
times routed_scaling_factor, plus the shared experts as one MLP; the routed experts clamp gate and
up at `swiglu_limit` (their banks' "swiglu_limited", as DeepSeek-V4's), the shared ones do not.

The release's names (hc_pre.*, linear_gate, learnable_sink_param) are renamed at conversion as
transformers' conversion_mapping does (ftw/families.py); its MTP layers are dropped there.
Not as transformers in 16 bits: its lm_head is float32 (the last hidden state cast up), ft's in
the compute dtype (a rounding of the head's weights and products apart; float32 is exact).
"""

from __future__ import annotations

from dataclasses import replace
from types import MappingProxyType
from typing import Any

import torch

from ftw.families import hy_v4_indexer_types

from ..config import ModelConfig, UnsupportedFamilyError
from ..experts import ExpertExecutor
from ..layers.hyper_connection import HyperHead, IndependentHyperConnection
from ..layers.mla import OutputGatedMLA
from ..loading.read_ftw import ModelWeights
from .base import FFN, Block, DecoderModel
from .deepseek_v3 import SigmoidMoE, rotary
from .glm_moe_dsa import DSAModel, DSAttention, Indexer
from .qwen3_moe import dense_mlp

# HYV4Config's defaults, for a config.json that leaves a key out
DEFAULTS: dict[str, Any] = dict(
    n_group=1, topk_group=1, norm_topk_prob=True, routed_scaling_factor=2.827, n_shared_experts=1, index_topk=2048,
    index_head_dim=128, index_n_heads=16, hc_mult=4, hc_magnitude=2.0, hc_eps=1e-6)

# transformers keeps these in float32 (_keep_in_fp32_modules_strict): routing, the indexer's weights and
# norm, the sinks and the hyper-connections must not see bf16-rounded values
KEEP_FLOAT32 = ("e_score_correction_bias", "mlp.gate.weight", "indexer.weights_proj.weight", "indexer.k_norm.weight",
                "indexer.k_norm.bias", "self_attn.sinks", "_hc.fn", "_hc.base", "_hc.scale", "hc_head.hc_fn",
                "hc_head.hc_base", "hc_head.hc_scale")


def check(config: ModelConfig, kinds: list[str]) -> None:
    """Refuse, by name, what transformers' Hy4 does not build or ft does not run."""
    if config.get("hidden_act", "silu") != "silu":
        raise UnsupportedFamilyError("hy_v4 with another hidden_act than silu is not supported")
    if config.get("q_lora_rank") is None:
        raise UnsupportedFamilyError("hy_v4 needs q_lora_rank: its queries and its indexer read the low-rank query")
    types = list(config.get("layer_types") or ["indexed_attention"] * config.num_layers)
    if len(types) != config.num_layers or set(types) != {"indexed_attention"}:
        raise UnsupportedFamilyError(f"hy_v4 layer_types {types} are not indexed_attention on every layer "
                                     "(the only attention HYV4Attention builds)")
    if len(kinds) != config.num_layers or set(kinds) - {"full", "shared"} or kinds[0] != "full":
        raise UnsupportedFamilyError(f"hy_v4 indexer_types {kinds} are not full or shared per layer, starting full "
                                     "(a shared layer reuses the last full layer's selection)")


def build(config: ModelConfig, weights: ModelWeights, executor: ExpertExecutor, dtype: torch.dtype) -> DecoderModel:
    source = {key: value for key, value in config.source.items() if value is not None}
    config = replace(config, source=MappingProxyType({**DEFAULTS, **source}))
    kinds = hy_v4_indexer_types({**config.source, "num_hidden_layers": config.num_layers})
    check(config, kinds)
    rope, eps, streams = rotary(config), config.rms_norm_eps, int(config.get("hc_mult"))
    magnitude, hc_eps = float(config.get("hc_magnitude")), float(config.get("hc_eps"))

    def hyper_connection(prefix: str) -> IndependentHyperConnection:
        return IndependentHyperConnection(weights.get(prefix + "fn"), weights.get(prefix + "base"),
                                          weights.get(prefix + "scale"), streams, magnitude, hc_eps, eps)

    blocks = []
    for i, kind in enumerate(kinds):
        p = f"model.layers.{i}."
        mla = OutputGatedMLA(config, weights, p + "self_attn.", rope, dtype, interleave=True)
        indexer = (Indexer(config, weights, p + "self_attn.indexer.", interleave=True, rope_last=True, norm_eps=eps)
                   if kind == "full" else None)
        attention = DSAttention(mla, indexer, int(config.get("index_head_dim")), sinks=weights.get(p + "self_attn.sinks"))
        ffn: FFN = (SigmoidMoE(config, weights, i, p + "mlp.", executor, DEFAULTS)
                    if i in config.moe_layers else dense_mlp(weights, p + "mlp."))
        blocks.append(Block(weights.get(p + "input_layernorm.weight"), attention,
                            weights.get(p + "post_attention_layernorm.weight"), ffn,
                            (hyper_connection(p + "attn_hc."), hyper_connection(p + "ffn_hc."))))
    head = HyperHead(weights.get("model.hc_head.hc_fn"), weights.get("model.hc_head.hc_base"),
                     weights.get("model.hc_head.hc_scale"), streams, hc_eps, eps)
    return DSAModel(config, weights, blocks, dtype, streams=head)
