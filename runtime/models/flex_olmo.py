"""FlexOlmo (flex_olmo): OLMo 2's post-norm block around OLMoE's parts. Attention with q and k
RMSNorms over the whole projection (olmoe.py's, never clipped here), every layer a softmax top-k
MoE renormalized where `norm_topk_prob` says (default false); no norm before attention or the
MoE, an RMSNorm of each one's output (`post_attention_layernorm`, `post_feedforward_layernorm`)
before it is added to the residual.

OLMo 2's RMSNorm multiplies by its weight before casting back (Llama's after): the same in
float32; in 16 bits this runs the shared `rms_norm`, a rounding apart.
"""

from __future__ import annotations

import torch

from ..config import ModelConfig, UnsupportedFamilyError
from ..experts import ExpertExecutor
from ..layers.attention import Start
from ..layers.norm import rms_norm
from ..layers.rope import RotaryEmbedding
from ..loading.read_ftw import ModelWeights
from .base import FFN, Block, DecoderModel, Mixer
from .olmoe import WholeProjectionNormAttention
from .qwen3_moe import SoftmaxMoE

DEFAULT_THETA = 500000.0  # FlexOlmoConfig's, for a config that names no rope base


class PostNormedMixer:
    """A mixer whose output is RMS-normed, with the mixer's interface (base.Mixer) and flags."""

    def __init__(self, mixer: Mixer, weight: torch.Tensor, eps: float) -> None:
        self.mixer, self.weight, self.eps = mixer, weight, eps
        self.takes_device_position = getattr(mixer, "takes_device_position", False)
        self.chunks_prompt = getattr(mixer, "chunks_prompt", False)

    def new_cache(self, max_tokens: int):
        return self.mixer.new_cache(max_tokens)

    def __call__(self, x: torch.Tensor, positions: torch.Tensor, cache, start: Start) -> torch.Tensor:
        return rms_norm(self.mixer(x, positions, cache, start), self.weight, self.eps)


def post_normed(ffn: FFN, weight: torch.Tensor, eps: float) -> FFN:
    return lambda x: rms_norm(ffn(x), weight, eps)


def unnormed(x: torch.Tensor) -> torch.Tensor:
    """The block's norm before attention and before the MoE: none (the norms come after)."""
    return x


def build(config: ModelConfig, weights: ModelWeights, executor: ExpertExecutor, dtype: torch.dtype) -> DecoderModel:
    if config.get("hidden_act", "silu") != "silu":
        raise UnsupportedFamilyError(f"FlexOlmo with hidden_act {config.get('hidden_act')!r} is not supported "
                                     "(the expert kernels compute SiLU)")
    params = config.rope_parameters
    if config.get("rope_theta") is None and "rope_theta" not in (config.get("rope_parameters") or {}):
        params["rope_theta"] = DEFAULT_THETA
    rope = RotaryEmbedding(config.head_dim, params, config.context_length)
    normalize, eps = bool(config.get("norm_topk_prob")), config.rms_norm_eps
    blocks = []
    for i in range(config.num_layers):
        p = f"model.layers.{i}."
        attention = WholeProjectionNormAttention(config, weights, p + "self_attn.", rope, dtype)
        attention.clip = None  # (FlexOlmo's attention clips nothing, whatever the config holds)
        moe = SoftmaxMoE(config, weights, i, p + "mlp.gate.weight", executor, normalize=normalize)
        blocks.append(Block(unnormed, PostNormedMixer(attention, weights.get(p + "post_attention_layernorm.weight"), eps),
                            unnormed, post_normed(moe, weights.get(p + "post_feedforward_layernorm.weight"), eps)))
    return DecoderModel(config, weights, blocks, dtype)
