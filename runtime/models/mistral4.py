"""Mistral 4 (mistral4: Mistral Small 4), the text model. The release is a `mistral3` multimodal
checkpoint whose `text_config` is mistral4; the converter picks the family by that text config,
drops the vision tower and projector and renames the text model's tensors to these (ftw/families.py).

DeepSeek-V3's model (deepseek_v3.py: multi-head latent attention with the low-rank query,
interleaved RoPE on the qk_rope_head_dim channels, YaRN in the release; dense MLPs on the first
`first_k_dense_replace` layers, then routed experts beside shared ones) with two changes:

- the queries, after their rotation, are scaled by Llama 4's temperature, counted from position 0:
  1 + llama_4_scaling_beta * log(1 + floor(p / original_max_position_embeddings)), both keys of
  `rope_parameters` (transformers' `get_llama_4_attn_scale`); without the beta, no temperature;
- the router scores experts by softmax, not sigmoid, with no correction bias: DeepSeek-V3's
  group-limited choice (groups scored by their top two), the top k renormalized
  (`norm_topk_prob`), times `routed_scaling_factor` (`Mistral4TopkRouter`).

transformers keeps nothing of Mistral 4 in float32: its router's logits and softmax are in the
model's dtype. ft takes the logits in the model's dtype and the softmax in float32, as its other
softmax routers (at float32 the two are the same).
"""

from __future__ import annotations

from typing import Any

import torch

from ..config import ModelConfig, UnsupportedFamilyError
from ..experts import ExpertExecutor
from ..layers.attention import Start, causal_attention
from ..layers.linear import linear
from ..layers.mla import MLACache, MLAttention
from ..layers.mlp import softmax_group_sum_topk
from ..layers.rope import RotaryEmbedding, query_temperature
from ..loading.read_ftw import ModelWeights
from .base import FFN, DecoderModel
from .deepseek_v3 import SigmoidMoE, block, rotary
from .qwen3_moe import dense_mlp

# Mistral4Config's defaults, for a config.json that leaves a key out
DEFAULTS = dict(n_group=1, topk_group=1, norm_topk_prob=True, routed_scaling_factor=1.0, n_shared_experts=1,
                rope_interleave=True)


class TemperedMLAttention(MLAttention):
    """MLA with the queries scaled by a position's temperature (`temperature`: (floor_scale,
    beta), None for none) before attention."""

    def __init__(self, config: ModelConfig, weights: ModelWeights, prefix: str, rope: RotaryEmbedding,
                 dtype: torch.dtype, *, interleave: bool, temperature: tuple[float, float] | None) -> None:
        super().__init__(config, weights, prefix, rope, dtype, interleave=interleave)
        self.temperature = temperature

    def __call__(self, x: torch.Tensor, positions: torch.Tensor, cache: MLACache, start: Start) -> torch.Tensor:
        assert self.rope is not None  # (Mistral 4 always rotates)
        cos, sin = self.rope(positions, x.dtype)
        q, _ = self.query(x, cos, sin)  # [T, heads, nope + rope]
        if self.temperature is not None:
            scales = query_temperature(positions, *self.temperature, offset=0.0)
            q = q * scales.to(q.dtype)[:, None, None]  # (in the query's dtype, as transformers multiplies)
        k, v = self.keys_values(x, cos, sin, cache, start)
        return self.output(causal_attention(q, k, v, start, self.scale))


class SoftmaxRoutedMoE(SigmoidMoE):
    """DeepSeek-V3's MoE block (routed experts through the executor plus the shared experts) with
    Mistral 4's router: softmax scores, no correction bias."""

    def __init__(self, config: ModelConfig, weights: ModelWeights, layer: int, prefix: str,
                 executor: ExpertExecutor) -> None:
        super().__init__(config, weights, layer, prefix, executor, DEFAULTS, bias=None)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        ids, weights = softmax_group_sum_topk(linear(x, self.router), self.k, self.num_groups, self.topk_groups,
                                              self.normalize, self.scaling)
        routed = self.executor(self.layer, x, ids, weights.to(x.dtype))
        return routed if self.shared is None else routed + self.shared(x)


def temperature(rope: dict[str, Any]) -> tuple[float, float] | None:
    """(floor_scale, beta) of the query temperature from `rope_parameters`; None without a beta."""
    beta = rope.get("llama_4_scaling_beta")
    if beta is None:
        return None
    if not rope.get("original_max_position_embeddings"):
        raise UnsupportedFamilyError("mistral4: rope_parameters has llama_4_scaling_beta but no "
                                     "original_max_position_embeddings, the positions its temperature steps by")
    return float(rope["original_max_position_embeddings"]), float(beta)


def build(config: ModelConfig, weights: ModelWeights, executor: ExpertExecutor, dtype: torch.dtype) -> DecoderModel:
    params = config.rope_parameters
    head_dim = int(config.get("qk_nope_head_dim")) + int(config.get("qk_rope_head_dim"))
    factor = params.get("partial_rotary_factor")
    if factor is not None and int(head_dim * float(factor)) != int(config.get("qk_rope_head_dim")):
        raise UnsupportedFamilyError(f"mistral4: partial_rotary_factor {factor} rotates {int(head_dim * float(factor))} "
                                     f"channels of a {head_dim}-wide head, not qk_rope_head_dim's "
                                     f"{config.get('qk_rope_head_dim')}; transformers cannot run such a config either")
    rope, scale = rotary(config), temperature(params)
    interleave = bool(config.get("rope_interleave", DEFAULTS["rope_interleave"]))
    blocks = []
    for i in range(config.num_layers):
        prefix = f"model.layers.{i}."
        attention = TemperedMLAttention(config, weights, prefix + "self_attn.", rope, dtype, interleave=interleave,
                                        temperature=scale)
        ffn: FFN = (SoftmaxRoutedMoE(config, weights, i, prefix + "mlp.", executor) if i in config.moe_layers
                    else dense_mlp(weights, prefix + "mlp."))
        blocks.append(block(config, weights, i, attention, ffn))
    return DecoderModel(config, weights, blocks, dtype)
