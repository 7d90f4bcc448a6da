"""Zyphra ZAYA1 (zaya): compressed convolutional attention (CCA: layers/cca_attention.py) on
every layer, "hybrid" layers attending to every earlier token and "hybrid_sliding" ones within
`sliding_window`, each kind rotating its heads' first `partial_rotary_factor` of channels at its
own base (rope_parameters keyed by layer type: layers/rope.ropes_by_layer_type).

The MoE on every layer: a router MLP over a narrower state, r = down_proj(x) (+ the previous
layer's r times router_states_scale, from the second layer on: ZAYA hands each token's router
state from one layer's MoE to the next, RouterStates here), then RMSNorm, two GELU layers and
out_proj to num_experts + 1 logits, softmaxed. The top one by probability + `balancing_biases`
(float32; the skip class's -1, as transformers sets it whatever the checkpoint holds) is taken, weighed by its probability; the last class is a "skip" expert that computes
nothing: a token choosing it gets expert 0 at weight 0. SwiGLU experts through the executor.

Each sublayer joins the residual as (x + residual_bias) * residual_scale + (out + bias) * scale,
per channel (base.Block's `scales` and `biases`); the embeddings are (e + bias) * scale
(DecoderModel's `embedding_bias` and `embedding_multiplier`). Where ft is not ZAYA in 16 bits:
transformers keeps the residual stream in float32, ft in the compute dtype (the same in float32).
"""

from __future__ import annotations

from dataclasses import replace
from types import MappingProxyType

import torch
import torch.nn.functional as F

from ..config import ModelConfig, UnsupportedFamilyError
from ..experts import ExpertExecutor
from ..layers.cca_attention import CCAttention
from ..layers.linear import linear
from ..layers.norm import rms_norm
from ..layers.rope import ropes_by_layer_type
from ..loading.read_ftw import ModelWeights
from .base import Block, DecoderModel, prompt_chunk
from .layer_schedule import layer_types as checked_layer_types

ROPE_DEFAULTS = {"hybrid": {"rope_type": "default", "rope_theta": 5_000_000.0, "partial_rotary_factor": 0.5},
                 "hybrid_sliding": {"rope_type": "default", "rope_theta": 10_000.0, "partial_rotary_factor": 0.5}}

# transformers makes the balancing biases a float32 buffer and adds them to float32 probabilities
KEEP_FLOAT32 = ("balancing_biases",)


class RouterStates:
    """Each token's router state from one MoE layer to the next, within one forward pass: layer L
    leaves its rows for layer L + 1 to take. A long prompt's FFN calls come a chunk at a time, each
    layer's chunks in order before the next layer's (base.PromptChunk), and every ZAYA layer is a
    MoE cut alike, so layer L + 1's chunk i takes layer L's chunk i."""

    def __init__(self) -> None:
        self.rows: dict[tuple[int, int], torch.Tensor] = {}

    @staticmethod
    def _chunk() -> int:
        chunk = prompt_chunk()
        return 0 if chunk is None else chunk.index

    def leave(self, layer: int, rows: torch.Tensor) -> None:
        if layer == 0 and self._chunk() == 0:
            self.rows.clear()  # (a new pass: the last layer's rows of the one before are not read)
        self.rows[(layer, self._chunk())] = rows

    def take(self, layer: int, num_tokens: int) -> torch.Tensor:
        rows = self.rows.pop((layer, self._chunk()))
        assert rows.shape[0] == num_tokens, "layers' FFN calls cut the tokens alike"
        return rows


class SkipExpertMoE:
    """ZAYA's router MLP (top 1 of num_experts + a skip expert) and its SwiGLU experts."""

    def __init__(self, config: ModelConfig, weights: ModelWeights, layer: int, prefix: str,
                 executor: ExpertExecutor, states: RouterStates) -> None:
        g = prefix + "gate."
        self.down, self.down_bias = weights.get(g + "down_proj.weight"), weights.maybe(g + "down_proj.bias")
        self.states_scale = weights.maybe(g + "router_states_scale") if layer > 0 else None  # [R]
        m = g + "router_mlp."
        self.norm = weights.get(m + "norm.weight")
        self.fc1, self.fc1_bias = weights.get(m + "fc1.weight"), weights.maybe(m + "fc1.bias")
        self.fc2, self.fc2_bias = weights.get(m + "fc2.weight"), weights.maybe(m + "fc2.bias")
        self.out = weights.get(m + "out_proj.weight")  # [E + 1, R]
        # [E + 1], float32; the skip class's at -1 whatever the checkpoint holds, as transformers' _init_weights
        # sets it on every load (ZayaRouter.balancing_biases[-1] = -1.0, after the checkpoint's values are read)
        balancing = weights.get(g + "balancing_biases")
        self.balancing = torch.cat((balancing[:-1], balancing.new_full((1,), -1.0)))
        self.layer, self.executor, self.states, self.eps = layer, executor, states, config.rms_norm_eps
        self.num_experts = config.num_experts

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        r = linear(x, self.down, self.down_bias)  # [T, R]
        if self.layer > 0:
            previous = self.states.take(self.layer - 1, x.shape[0])
            if self.states_scale is not None:
                r = r + previous * self.states_scale
        self.states.leave(self.layer, r)
        h = F.gelu(linear(rms_norm(r, self.norm, self.eps), self.fc1, self.fc1_bias))
        h = F.gelu(linear(h, self.fc2, self.fc2_bias))
        probs = torch.softmax(linear(h, self.out), dim=-1)  # [T, E + 1]
        ids = (probs.to(torch.float32) + self.balancing).topk(1, dim=-1).indices  # [T, 1]
        weights = probs.gather(-1, ids)
        skip = ids == self.num_experts  # (the skip expert: nothing computed, weight 0 on expert 0)
        return self.executor(self.layer, x, ids.masked_fill(skip, 0), weights.masked_fill(skip, 0))


def check(config: ModelConfig) -> list[str]:
    """The layer kinds, refusing what ZAYA's executor here cannot run."""
    if config.get("hidden_act", "silu") != "silu":
        raise UnsupportedFamilyError("zaya with another hidden_act than silu is not supported")
    if config.num_experts_per_tok != 1:  # (ZayaConfig refuses it too: its skip expert is a top-1 rule)
        raise UnsupportedFamilyError("zaya with num_experts_per_tok other than 1 is not supported")
    types = checked_layer_types(config, "zaya", lambda i: "hybrid", ("hybrid", "hybrid_sliding"))
    if "hybrid_sliding" in types and not config.get("sliding_window"):
        raise UnsupportedFamilyError("zaya with hybrid_sliding layers needs a sliding_window")
    if tuple(config.moe_layers) != tuple(range(config.num_layers)):
        raise UnsupportedFamilyError("zaya needs a MoE on every layer (its router state passes from each to the next)")
    return types


def build(config: ModelConfig, weights: ModelWeights, executor: ExpertExecutor, dtype: torch.dtype) -> DecoderModel:
    types = check(config)
    params = config.get("rope_parameters")
    if isinstance(params, dict) and "rope_type" in params:  # (the hub's config has a stray one beside the kinds)
        params = {k: v for k, v in params.items() if k != "rope_type"}
        config = replace(config, source=MappingProxyType({**config.source, "rope_parameters": params}))
    ropes = ropes_by_layer_type(config, types, ROPE_DEFAULTS, "zaya")
    window = config.get("sliding_window")
    states = RouterStates()
    blocks = []
    for i, kind in enumerate(types):
        p = f"model.layers.{i}."
        attention = CCAttention(weights, p + "self_attn.", ropes[kind], dtype, heads=config.num_attention_heads,
                                kv_heads=config.num_key_value_heads, head_dim=config.head_dim,
                                window=window if kind == "hybrid_sliding" else None)
        moe = SkipExpertMoE(config, weights, i, p + "mlp.", executor, states)
        a, m = p + "post_attention_residual_scale.", p + "post_mlp_residual_scale."
        scales = ((weights.get(a + "residual_scale"), weights.get(a + "hidden_states_scale")),
                  (weights.get(m + "residual_scale"), weights.get(m + "hidden_states_scale")))
        biases = ((weights.get(a + "residual_bias"), weights.get(a + "hidden_states_bias")),
                  (weights.get(m + "residual_bias"), weights.get(m + "hidden_states_bias")))
        blocks.append(Block(weights.get(p + "input_layernorm.weight"), attention,
                            weights.get(p + "post_attention_layernorm.weight"), moe, scales=scales, biases=biases))
    model = DecoderModel(config, weights, blocks, dtype, embedding_multiplier=weights.get("model.input_hidden_states_scale"),
                         embedding_bias=weights.get("model.input_hidden_states_bias"))
    if config.get("lm_head_bias"):  # (a bias on the head, which may be tied to the embeddings all the same)
        model.lm_head_bias = weights.get("lm_head.bias")
    return model
