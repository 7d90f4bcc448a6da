"""MiniMax-Text-01 (minimax): a hybrid of lightning-attention layers (linear attention with a
decay per head; layers/lightning_attention.py) and GQA softmax-attention layers with RoPE, as
`layer_types` says (by default full on even layers, linear on odd ones); every layer a Mixtral
MoE (softmax top-k, renormalized; mixtral.py's names). The residual is the normed stream, not
the stream: h = norm(x); x = alpha h + beta mixer(h); then h = norm(x); x = alpha h + beta
ffn(h), each alpha and beta the config's for that sublayer kind (`*_alpha_factor`,
`*_beta_factor`; 1 by default), through DecoderModel's residual interface."""

from __future__ import annotations

import torch

from ..config import ModelConfig, UnsupportedFamilyError
from ..experts import ExpertExecutor
from ..layers.lightning_attention import LightningAttention
from ..layers.norm import rms_norm
from ..layers.rope import RotaryEmbedding
from ..loading.read_ftw import ModelWeights
from .base import Block, DecoderModel, Mixer
from .flex_olmo import unnormed
from .mixtral import moe_prefix
from .qwen3_moe import GQAAttention, SoftmaxMoE

DEFAULT_BLOCK_SIZE = 256  # MiniMaxConfig's block_size


class NormedResidual:
    """A sublayer whose residual is its own normed input: enter gives h = norm(x), leave
    alpha h + beta out (base.Residual, on the one stream x [T, H])."""

    def __init__(self, weight: torch.Tensor, eps: float, alpha: float, beta: float) -> None:
        self.weight, self.eps, self.alpha, self.beta = weight, eps, alpha, beta

    def enter(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = rms_norm(x, self.weight, self.eps)
        return h, h

    def leave(self, x: torch.Tensor, out: torch.Tensor, mixes: torch.Tensor) -> torch.Tensor:
        return mixes * self.alpha + out * self.beta


def layer_types(config: ModelConfig) -> list[str]:
    types = config.get("layer_types") or ["full_attention" if (i + 1) % 2 else "linear_attention"
                                          for i in range(config.num_layers)]
    if len(types) != config.num_layers or set(types) - {"full_attention", "linear_attention"}:
        raise UnsupportedFamilyError(f"unsupported minimax layer_types {types!r} for {config.num_layers} layers")
    return list(types)


def build(config: ModelConfig, weights: ModelWeights, executor: ExpertExecutor, dtype: torch.dtype) -> DecoderModel:
    if config.get("sliding_window"):
        raise UnsupportedFamilyError("MiniMax with a sliding attention window is not supported yet")
    if config.get("hidden_act", "silu") != "silu":
        raise UnsupportedFamilyError(f"MiniMax with hidden_act {config.get('hidden_act')!r} is not supported")

    def factor(key: str) -> float:
        return float(config.get(key, 1))

    rope = RotaryEmbedding(config.head_dim, config.rope_parameters, config.context_length)
    block_size, eps = int(config.get("block_size", DEFAULT_BLOCK_SIZE)), config.rms_norm_eps
    blocks = []
    for i, kind in enumerate(layer_types(config)):
        p = f"model.layers.{i}."
        mixer: Mixer
        if kind == "linear_attention":
            mixer = LightningAttention(weights, p + "self_attn.", heads=config.num_attention_heads,
                                       head_dim=config.head_dim, layer=i, num_layers=config.num_layers,
                                       block_size=block_size, dtype=dtype)
            attn = (factor("linear_attn_alpha_factor"), factor("linear_attn_beta_factor"))
        else:
            mixer = GQAAttention(config, weights, p + "self_attn.", rope, dtype, qk_norm=False)
            attn = (factor("full_attn_alpha_factor"), factor("full_attn_beta_factor"))
        moe = SoftmaxMoE(config, weights, i, moe_prefix(weights, p) + "gate.weight", executor, normalize=True)
        residuals = (NormedResidual(weights.get(p + "input_layernorm.weight"), eps, *attn),
                     NormedResidual(weights.get(p + "post_attention_layernorm.weight"), eps,
                                    factor("mlp_alpha_factor"), factor("mlp_beta_factor")))
        blocks.append(Block(unnormed, mixer, unnormed, moe, residuals=residuals))
    return DecoderModel(config, weights, blocks, dtype)
