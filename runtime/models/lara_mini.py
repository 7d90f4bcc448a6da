"""Lara Mini (lara_mini, Translated's Lara-4-Mini): a Qwen3.5-style hybrid whose layers run, as
`layer_types` says (LaraMiniConfig's period-5 schedule where absent), Qwen3.5's Gated DeltaNet
(layers/gated_deltanet.py), or Qwen3's attention (GQA with per-head q/k RMSNorms, no output gate:
qwen3_moe.GQAAttention) in two kinds: sliding layers rotate (RoPE, whole heads) and attend within
`sliding_window` positions, full layers attend to everything without any position encoding (NoPE).
Every layer's MLP is a MoE: softmax over a float32 router's logits, the top k, renormalized where
`norm_topk_prob`, plus one shared SwiGLU expert added in full, with no gate (Qwen3.5's gates it).

Its RMSNorms are plain (w, not Qwen3.5's 1 + w) and multiply the float32 normalized input by the
float32 weight before the cast back: the block and final norms run so (layers/norm.Float32RMSNorm);
the q/k norms and the DeltaNet's gated output norm run the shared `rms_norm`, a rounding apart in
16 bits only. The release fuses the DeltaNet's input projections into one `in_proj` (rows q | k |
v | z | b | a, Qwen3.5's split order) and names its gated norm `out_norm` (renamed at conversion,
ftw/families.py, as transformers' conversion_mapping does); `in_proj` is kept whole and its output
split, and a checkpoint transformers saved split (in_proj_qkv/z/b/a) reads as Qwen3.5's.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ftw.families import lara_mini_layer_types

from ..config import ModelConfig, UnsupportedFamilyError
from ..experts import ExpertExecutor
from ..layers.gated_deltanet import GatedDeltaNet
from ..layers.linear import linear
from ..layers.mlp import softmax_topk
from ..layers.norm import Float32RMSNorm
from ..layers.rope import apply_rotary, whole_head_rope
from ..loading.read_ftw import ModelWeights
from .base import Block, DecoderModel, Mixer
from .qwen3_moe import GQAAttention, dense_mlp


class FusedProjectionDeltaNet(GatedDeltaNet):
    """Qwen3.5's Gated DeltaNet with its four input projections in one `in_proj` [2K + 2V + 2Hv, H]
    (rows q | k | v | z | b | a), as the release stores it; without one, Qwen3.5's split ones."""

    def load_projections(self, weights: ModelWeights, prefix: str) -> None:
        self.in_proj = weights.maybe(prefix + "in_proj.weight")
        if self.in_proj is None:
            super().load_projections(weights, prefix)

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        if self.in_proj is None:
            return super().project(x)
        qkv, z, b, a = linear(x, self.in_proj).split(
            [2 * self.key_size + self.value_size, self.value_size, self.v_heads, self.v_heads], dim=-1)
        return qkv, z, b, a


class SoftmaxSharedMoE:
    """Router (float32 logits, softmax, the top k, renormalized where `normalize`) + routed experts
    through the executor + an ungated shared SwiGLU expert added in full."""

    def __init__(self, config: ModelConfig, weights: ModelWeights, layer: int, prefix: str,
                 executor: ExpertExecutor, *, normalize: bool) -> None:
        self.router = weights.get(prefix + "gate.weight")
        self.shared = dense_mlp(weights, prefix + "shared_expert.")
        self.layer, self.executor, self.k, self.normalize = layer, executor, config.num_experts_per_tok, normalize

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        logits = F.linear(x.to(torch.float32), self.router.to(torch.float32))  # (float32, unlike Qwen3-Next's)
        ids, weights = softmax_topk(logits, self.k, self.normalize)
        return self.executor(self.layer, x, ids, weights.to(x.dtype)) + self.shared(x)


def build(config: ModelConfig, weights: ModelWeights, executor: ExpertExecutor, dtype: torch.dtype) -> DecoderModel:
    if config.get("hidden_act", "silu") != "silu":  # (the experts', the shared expert's and the DeltaNet conv's)
        raise UnsupportedFamilyError(f"lara_mini with hidden_act {config.get('hidden_act')!r} is not supported")
    try:
        types = lara_mini_layer_types(dict(config.source))
    except ValueError as e:
        raise UnsupportedFamilyError(str(e)) from None
    window = config.source.get("sliding_window", 512)  # (LaraMiniConfig's default where absent)
    if "sliding_attention" in types and not window:  # (transformers then rotates but masks nothing)
        raise UnsupportedFamilyError("lara_mini with sliding_attention layers but no sliding_window is not supported")
    rope = whole_head_rope(config, "lara_mini")
    normalize = bool(config.get("norm_topk_prob", True))

    def norm(name: str) -> Float32RMSNorm:
        return Float32RMSNorm(weights.get(name), config.rms_norm_eps)

    blocks = []
    for i, kind in enumerate(types):
        p = f"model.layers.{i}."
        sliding = kind == "sliding_attention"
        mixer: Mixer = (FusedProjectionDeltaNet(config, weights, p + "linear_attn.", dtype) if kind == "linear_attention"
                        else GQAAttention(config, weights, p + "self_attn.", rope, dtype, qk_norm=True,
                                          rotary=apply_rotary if sliding else None,
                                          window=int(window) if sliding else None))
        moe = SoftmaxSharedMoE(config, weights, i, p + "mlp.", executor, normalize=normalize)
        blocks.append(Block(norm(p + "input_layernorm.weight"), mixer, norm(p + "post_attention_layernorm.weight"), moe))
    return DecoderModel(config, weights, blocks, dtype, final_norm=norm("model.norm.weight"))
