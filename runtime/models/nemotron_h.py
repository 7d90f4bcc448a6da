"""NVIDIA Nemotron-H (nemotron_h; Nemotron 3 Nano 30B-A3B): one mixer or one FFN a layer, as the
config's pattern says (ftw.families.nemotron_h_layer_types: hybrid_override_pattern's M, *, E, -):
Mamba2 layers (layers/mamba2.py), GQA attention layers without a position encoding (transformers'
NemotronHAttention rotates nothing: the Mamba2 layers carry the order), MoE layers and dense MLP
layers, each a pre-norm (`norm`) and a residual add. The MoE is DeepSeek-V3's sigmoid router with
the correction bias and group-limited top-k (deepseek_v3.SigmoidMoE) over experts that are not
gated, relu(up x)^2 then down (the bank's "relu2" activation), plus a shared MLP of the same
form; the dense MLP layers are that form too. Names as transformers holds them (the release's
backbone., embeddings and norm_f renamed at conversion: ftw/families.py).
"""

from __future__ import annotations

from dataclasses import replace
from types import MappingProxyType

import torch
import torch.nn.functional as F

from ftw.families import nemotron_h_layer_types, nemotron_h_view

from ..config import ModelConfig, UnsupportedFamilyError
from ..experts import ExpertExecutor
from ..layers.linear import linear
from ..layers.mamba2 import Mamba2Mixer
from ..layers.rope import RotaryEmbedding
from ..loading.read_ftw import ModelWeights
from .base import FFN, NO_MIXER, Block, DecoderModel
from .deepseek_v3 import SigmoidMoE
from .qwen3_moe import GQAAttention

# NemotronHConfig's defaults, for checkpoints whose config.json leaves a key out
DEFAULTS = dict(n_group=1, topk_group=1, norm_topk_prob=True, routed_scaling_factor=1.0, n_shared_experts=1)

# transformers keeps these in float32 (_keep_in_fp32_modules_strict): routing must not see bf16-rounded values
KEEP_FLOAT32 = ("e_score_correction_bias", "mixer.gate.weight")


def relu2_mlp(weights: ModelWeights, prefix: str) -> FFN:
    """down(relu(up x)^2): NemotronHMLP, a dense layer's MLP and the MoE's shared experts."""
    up, down = weights.get(prefix + "up_proj.weight"), weights.get(prefix + "down_proj.weight")
    up_bias, down_bias = weights.maybe(prefix + "up_proj.bias"), weights.maybe(prefix + "down_proj.bias")
    return lambda x: linear(F.relu(linear(x, up, up_bias)).square(), down, down_bias)


def build(config: ModelConfig, weights: ModelWeights, executor: ExpertExecutor, dtype: torch.dtype) -> DecoderModel:
    for key, want in (("mlp_hidden_act", "relu2"), ("mamba_hidden_act", "silu")):
        if config.get(key, want) != want:
            raise UnsupportedFamilyError(f"Nemotron-H with {key} {config.get(key)!r} is not supported (ft runs {want})")
    if config.get("moe_latent_size"):
        raise UnsupportedFamilyError("Nemotron-H with a latent MoE (moe_latent_size) is not supported yet")
    # its Mamba2 sizes and norm epsilon under the names layers/mamba2.py and DecoderModel read
    config = replace(config, source=MappingProxyType({**config.source, **nemotron_h_view(dict(config.source))}))
    rope = RotaryEmbedding(config.head_dim, config.rope_parameters, config.context_length)  # (unused: NoPE)
    blocks = []
    for i, kind in enumerate(nemotron_h_layer_types(dict(config.source))):
        p = f"model.layers.{i}."
        norm = weights.get(p + "norm.weight")
        if kind == "linear_attention":
            blocks.append(Block(norm, Mamba2Mixer(config, weights, p + "mixer.", dtype), norm, None))
        elif kind == "full_attention":
            attention = GQAAttention(config, weights, p + "mixer.", rope, dtype, qk_norm=False, rotary=None)
            blocks.append(Block(norm, attention, norm, None))
        elif kind == "moe":
            moe = SigmoidMoE(config, weights, i, p + "mixer.", executor, DEFAULTS, shared_mlp=relu2_mlp)
            blocks.append(Block(norm, NO_MIXER, norm, moe))
        else:
            blocks.append(Block(norm, NO_MIXER, norm, relu2_mlp(weights, p + "mixer.")))
    return DecoderModel(config, weights, blocks, dtype)
