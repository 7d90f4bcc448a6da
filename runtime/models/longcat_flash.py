"""LongCat-Flash (longcat_flash: Meituan's LongCat-Flash-Chat), as transformers' LongcatFlashForCausalLM.

Each of its `num_layers` layers holds two attention sublayers and two dense MLPs, and one MoE
that reads the first MLP's input and joins the residual only after the second MLP (a shortcut):

    x += attn0(norm(x)); h = norm(x); s = moe(h); x += mlp0(h)
    x += attn1(norm(x)); x = x + mlp1(norm(x)) + s

ft runs each layer as two Blocks over a residual of two streams, x [T, 2, H]: stream 0 the
residual, stream 1 the shortcut's output from the first half until the second half adds it (the
way DecoderModel carries DeepSeek-V4's streams, so chunked prefill and decode graphs need nothing
new). Attention is DeepSeek-V3's MLA (layers/mla.py: the low-rank query, interleaved rope on the
qk_rope_head_dim channels) with the normed query latent times sqrt(hidden / q_lora_rank) and the
normed KV latent times sqrt(hidden / kv_lora_rank), which ft folds into the two latent norms'
weights. The router scores the `n_routed_experts` real experts and `zero_expert_num` zero-computation
ones by softmax (float32), chooses the top k with the correction bias, weighs with the unbiased
scores times `routed_scaling_factor` (not renormalized). A zero expert's output is its input:
ZeroExpertMoE adds x times the zero experts' weights itself and gives the executor real experts
only. transformers makes `router.classifier` with a bias where `router_bias` is set, and never
reads it; ft does the same.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..config import ModelConfig, UnsupportedFamilyError
from ..experts import ExpertExecutor
from ..layers.mla import MLAttention
from ..layers.mlp import _group_limited_topk
from ..layers.rope import RotaryEmbedding
from ..loading.read_ftw import ModelWeights
from .base import FFN, Block, DecoderModel
from .deepseek_v3 import rotary
from .qwen3_moe import dense_mlp


class LatentScaledMLA(MLAttention):
    """MLA with LongCat's latent scales, folded into the latent norms' weights (the norms are
    linear in their weight: the same values up to one rounding)."""

    def __init__(self, config: ModelConfig, weights: ModelWeights, prefix: str, rope: RotaryEmbedding,
                 dtype: torch.dtype) -> None:
        super().__init__(config, weights, prefix, rope, dtype, interleave=True)
        hidden = config.hidden_size
        self.q_a_norm = self.q_a_norm * (hidden / int(config.get("q_lora_rank"))) ** 0.5
        self.kv_a_norm = self.kv_a_norm * (hidden / self.kv_lora_rank) ** 0.5


class ZeroExpertMoE:
    """Softmax router over real and zero experts (see the module doc); routed ids at or past
    `num_experts` are the zero experts: their weights times x are added here, and the executor
    sees each such slot as the token's first real expert with weight 0 (expert 0 where a token
    chose zero experts alone), so it computes real experts only and loads none for them."""

    def __init__(self, config: ModelConfig, weights: ModelWeights, layer: int, prefix: str,
                 executor: ExpertExecutor) -> None:
        self.router = weights.get(prefix + "router.classifier.weight")  # [E + zero experts, H]
        self.bias = weights.get(prefix + "router.e_score_correction_bias")
        self.layer, self.executor, self.k = layer, executor, config.num_experts_per_tok
        self.num_experts, self.scaling = config.num_experts, float(config.get("routed_scaling_factor", 6.0))

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        # transformers keeps the classifier in float32 and routes in float32 whatever the model dtype
        scores = torch.softmax(F.linear(x.to(torch.float32), self.router.to(torch.float32)), dim=-1)
        ids, weights = _group_limited_topk(scores, scores + self.bias.to(torch.float32), self.k, 1, 1, False,
                                           self.scaling)  # [T, k] each
        zero = ids >= self.num_experts
        identity = weights.masked_fill(~zero, 0.0).sum(dim=-1, keepdim=True)  # [T, 1]
        first_real = ids.gather(1, (~zero).to(torch.int32).argmax(dim=-1, keepdim=True))  # [T, 1]
        fill = torch.where(first_real < self.num_experts, first_real, torch.zeros_like(first_real))
        ids, weights = torch.where(zero, fill, ids), weights.masked_fill(zero, 0.0)
        routed = self.executor(self.layer, x, ids, weights.to(x.dtype))
        return routed + (x.to(torch.float32) * identity).to(x.dtype)


class ShortcutStreams:
    """The residual and the shortcut's pending output, x [T, 2, H] (base.Streams)."""

    def expand(self, x: torch.Tensor) -> torch.Tensor:
        return torch.stack((x, torch.zeros_like(x)), dim=1)

    def collapse(self, x: torch.Tensor) -> torch.Tensor:
        return x[:, 0]


class Through:
    """A sublayer added to the residual, the shortcut carried as it is (base.Residual)."""

    def enter(self, x: torch.Tensor) -> tuple[torch.Tensor, None]:
        return x[:, 0], None

    def leave(self, x: torch.Tensor, out: torch.Tensor, mixes: None) -> torch.Tensor:
        return torch.stack((x[:, 0] + out, x[:, 1]), dim=1)


class Opens(Through):
    """The first MLP and the MoE beside it: out [T, 2, H] (MLP, MoE), the MoE's kept aside."""

    def leave(self, x: torch.Tensor, out: torch.Tensor, mixes: None) -> torch.Tensor:
        return torch.stack((x[:, 0] + out[:, 0], out[:, 1]), dim=1)


class Closes(Through):
    """The second MLP, then the shortcut's output, added in transformers' order."""

    def leave(self, x: torch.Tensor, out: torch.Tensor, mixes: None) -> torch.Tensor:
        return torch.stack((x[:, 0] + out + x[:, 1], torch.zeros_like(out)), dim=1)


class MLPAndShortcut:
    """The first MLP and the MoE, both of the same normed input: [T, 2, H]."""

    def __init__(self, mlp: FFN, moe: ZeroExpertMoE) -> None:
        self.mlp, self.moe = mlp, moe

    def __call__(self, h: torch.Tensor) -> torch.Tensor:
        shortcut = self.moe(h)
        return torch.stack((self.mlp(h), shortcut), dim=1)


THROUGH, OPENS, CLOSES = Through(), Opens(), Closes()


def check(config: ModelConfig) -> None:
    """Refuse what transformers' LongcatFlash cannot run or ft does not."""
    nope, rope = int(config.get("qk_nope_head_dim")), int(config.get("qk_rope_head_dim"))
    if int(config.get("qk_head_dim", nope + rope)) != nope + rope:
        raise UnsupportedFamilyError(f"longcat_flash: qk_head_dim {config.get('qk_head_dim')} is not qk_nope_head_dim "
                                     f"+ qk_rope_head_dim ({nope} + {rope}); transformers cannot run such a config either")
    if config.get("q_lora_rank") is None:
        raise UnsupportedFamilyError("longcat_flash: no q_lora_rank; LongCat's attention always has the low-rank query")
    if config.get("hidden_act", "silu") != "silu":
        raise UnsupportedFamilyError(f"longcat_flash: hidden_act {config.get('hidden_act')!r}; ft runs SwiGLU (silu)")


def half_layer(config: ModelConfig, weights: ModelWeights, prefix: str, j: int, rope: RotaryEmbedding,
               dtype: torch.dtype, ffn: FFN, closing: Through) -> Block:
    """The `j`-th half of a layer: its attention sublayer and its MLP (the first's with the MoE beside it)."""
    return Block(weights.get(prefix + f"input_layernorm.{j}.weight"),
                 LatentScaledMLA(config, weights, prefix + f"self_attn.{j}.", rope, dtype),
                 weights.get(prefix + f"post_attention_layernorm.{j}.weight"), ffn, residuals=(THROUGH, closing))


def build(config: ModelConfig, weights: ModelWeights, executor: ExpertExecutor, dtype: torch.dtype) -> DecoderModel:
    check(config)
    rope = rotary(config)
    blocks: list[Block] = []
    for i in range(config.num_layers):
        p = f"model.layers.{i}."
        moe = ZeroExpertMoE(config, weights, i, p + "mlp.", executor)
        blocks.append(half_layer(config, weights, p, 0, rope, dtype, MLPAndShortcut(dense_mlp(weights, p + "mlps.0."), moe), OPENS))
        blocks.append(half_layer(config, weights, p, 1, rope, dtype, dense_mlp(weights, p + "mlps.1."), CLOSES))
    return DecoderModel(config, weights, blocks, dtype, streams=ShortcutStreams())
