"""Qwen3-Next (qwen3_next): Qwen3.5's text model (qwen3_5_moe.py: Gated DeltaNet and gated full
attention, zero-centred norms, a softmax top-k MoE plus a sigmoid-gated shared expert) before
its projections were split. Each DeltaNet layer projects q, k, v and z with one matrix and b, a
with another (`in_proj_qkvz`, `in_proj_ba`), their rows grouped per key head; the router
renormalizes its top-k only where `norm_topk_prob` says. Weights live under `model.`; the
multi-token-prediction weights (`mtp.`) are dropped at conversion.
"""

from __future__ import annotations

import torch

from ..config import ModelConfig
from ..experts import ExpertExecutor
from ..layers.gated_deltanet import GatedDeltaNet
from ..layers.linear import linear
from ..loading.read_ftw import ModelWeights
from .base import DecoderModel
from .qwen3_5_moe import SharedExpertMoE, hybrid_model

PREFIX = "model."


def split_ba(delta: GatedDeltaNet, in_ba: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """b and a [T, Hv] out of `in_ba`, whose rows are [b_g (r heads) | a_g (r heads)] per key head g."""
    t, per_group = x.shape[0], delta.v_heads // delta.k_heads
    b, a = linear(x, in_ba).view(t, delta.k_heads, 2 * per_group).split([per_group, per_group], dim=-1)
    return b.reshape(t, -1), a.reshape(t, -1)


class GroupedProjectionDeltaNet(GatedDeltaNet):
    """Gated DeltaNet whose q/k/v/z and b/a come out of two projections grouped per key head:
    [q_g | k_g | v_g (r heads) | z_g (r heads)] and [b_g (r) | a_g (r)] for each key head g, with
    r value heads per key head (transformers' `fix_query_key_value_ordering`). The projections
    are kept as stored; each call regroups its outputs into the split layout."""

    def load_projections(self, weights: ModelWeights, prefix: str) -> None:
        self.in_qkvz = weights.get(prefix + "in_proj_qkvz.weight")
        self.in_ba = weights.get(prefix + "in_proj_ba.weight")

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        t, groups = x.shape[0], self.k_heads
        per_group = self.v_heads // self.k_heads
        dk, dv = self.k_head_dim, self.v_head_dim
        qkvz = linear(x, self.in_qkvz).view(t, groups, 2 * dk + 2 * per_group * dv)
        q, k, v, z = qkvz.split([dk, dk, per_group * dv, per_group * dv], dim=-1)
        qkv = torch.cat((q.reshape(t, -1), k.reshape(t, -1), v.reshape(t, -1)), dim=-1)
        return (qkv, z.reshape(t, -1), *split_ba(self, self.in_ba, x))


class SplitQKVDeltaNet(GatedDeltaNet):
    """Qwen3-Next as newer llama.cpp files store it: q|k|v of all heads and z as Qwen3.5 has them
    (`in_proj_qkv`, `in_proj_z`: Qwen3NextModel split in_proj_qkvz so), b and a still grouped."""

    def load_projections(self, weights: ModelWeights, prefix: str) -> None:
        self.in_qkv, self.in_z = weights.get(prefix + "in_proj_qkv.weight"), weights.get(prefix + "in_proj_z.weight")
        self.in_ba = weights.get(prefix + "in_proj_ba.weight")

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        return (linear(x, self.in_qkv), linear(x, self.in_z), *split_ba(self, self.in_ba, x))


def qwen3_next_deltanet(config: ModelConfig, weights: ModelWeights, prefix: str, dtype: torch.dtype) -> GatedDeltaNet:
    """The layer's DeltaNet as its weights are laid out: in_proj_qkvz whole (transformers', older
    GGUF files), or split (newer GGUF files)."""
    whole = weights.maybe(prefix + "in_proj_qkvz.weight") is not None
    return (GroupedProjectionDeltaNet if whole else SplitQKVDeltaNet)(config, weights, prefix, dtype)


class NormalizedSharedExpertMoE(SharedExpertMoE):
    """Qwen3.5's MoE block with the top-k renormalized only where `norm_topk_prob` is set
    (`normalize_by_default`: the family's default where config.json leaves it out)."""

    def __init__(self, config: ModelConfig, weights: ModelWeights, layer: int, prefix: str,
                 executor: ExpertExecutor, *, normalize_by_default: bool = True) -> None:
        normalize = config.get("norm_topk_prob")
        super().__init__(config, weights, layer, prefix, executor,
                         normalize=normalize_by_default if normalize is None else bool(normalize))


def build(config: ModelConfig, weights: ModelWeights, executor: ExpertExecutor, dtype: torch.dtype) -> DecoderModel:
    return hybrid_model(config, weights, dtype, prefix=PREFIX, deltanet=qwen3_next_deltanet,
                        moe=lambda layer, prefix: NormalizedSharedExpertMoE(config, weights, layer, prefix, executor))
