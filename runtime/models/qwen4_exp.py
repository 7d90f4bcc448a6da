"""Qwen4-Exp (qwen4_exp, text): Qwen3.5's hybrid (qwen3_5_moe.py: Gated DeltaNet and gated attention,
a softmax top-k MoE with a sigmoid-gated shared expert on every layer, renormalized where
`norm_topk_prob`, its default on) with three changes transformers' Qwen4ExpTextModel makes:

- the residual is `hc_count` streams joined by gated hyper-connections (layers/hyper_connection.py
  GatedHyperConnection), which replace the input, post-attention and final norms;
- every attention layer ("indexed_attention", the release's "full_attention") attends only to the
  tokens its QSA indexer selects (`QSAttention`): each query's earlier tokens are cut into blocks of
  `indexer_compress_ratio`, the complete ones scored and the best `indexer_budget / ratio` kept,
  with the incomplete last block always;
- the DeltaNet's output norm gates with `output_gate_type` (silu or sigmoid; hidden_act where unset).

RoPE covers the whole head unless `partial_rotary_factor` says otherwise (Qwen3.5's default of 1/4
is not carried over). Weights live under `model.language_model.` (the vision tower is dropped at
conversion), or `model.` in a text model saved alone (qwen4_exp_text, Qwen4ExpForCausalLM's). Per-Layer Embeddings (`ple_layer_ids`: hashed n-gram tables) are refused by name.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ..config import ModelConfig, UnsupportedFamilyError
from ..experts import ExpertExecutor
from ..layers.attention import KVCache, Start, causal_attention, store
from ..layers.gated_deltanet import GatedDeltaNet
from ..layers.hyper_connection import GatedHyperConnection, GatedHyperHead
from ..layers.linear import linear
from ..layers.norm import rms_norm
from ..layers.rope import RotaryEmbedding, apply_rotary, partial_rotary
from ..loading.read_ftw import ModelWeights
from .base import Block, DecoderModel, Mixer
from .qwen3_5_moe import GatedAttention
from .qwen3_next import NormalizedSharedExpertMoE

PREFIXES = ("model.language_model.", "model.")  # (beside a vision tower; the text model alone)
GATE_ACTIVATIONS = {"silu": F.silu, "sigmoid": torch.sigmoid}
SCORES_PER_CALL = 1 << 26  # indexer scores (queries x blocks x heads, float32) held at once: 256 MiB


def layer_types(config: ModelConfig) -> list[str]:
    """"linear_attention" or "indexed_attention" per layer, as Qwen4ExpTextConfig reads them (the
    release's "full_attention" is an indexed layer; every `full_attention_interval`-th by default)."""
    types = config.get("layer_types")
    if types is None:
        interval = int(config.get("full_attention_interval", 4))
        types = ["linear_attention" if (i + 1) % interval else "indexed_attention" for i in range(config.num_layers)]
    types = ["indexed_attention" if t == "full_attention" else t for t in types]
    if len(types) != config.num_layers or set(types) - {"linear_attention", "indexed_attention"}:
        raise ValueError(f"unsupported qwen4_exp layer_types {types!r} for {config.num_layers} layers")
    return types


class QSACache(KVCache):
    """Keys and values, and each token's raw indexer key [max_tokens, indexer_head_dim] (before the
    block pooling, its norm and rotation), a row a position."""

    def __init__(self, max_tokens: int, kv_heads: int, head_dim: int, index_head_dim: int, dtype: torch.dtype) -> None:
        super().__init__(max_tokens, kv_heads, head_dim, head_dim, dtype)
        self.index_keys = torch.zeros(max_tokens, index_head_dim, dtype=dtype)


class QSAttention(GatedAttention):
    """Qwen3.5's gated attention whose queries see only the tokens their QSA indexer selects
    (transformers' Qwen4ExpTextQSAIndexer): `index_qk_proj` gives `indexer_n_heads` query heads and
    one key a token; the queries are RMS-normed (1 + w) and rotated at their positions; the keys of
    each complete block of `ratio` tokens are averaged (in float32), normed and rotated at the
    block's first position. A block's score is sum over heads of relu(q . k) / sqrt(D); a query
    keeps its best `budget / ratio` complete blocks (all where it has no more) and the tokens of its
    incomplete last block. At a DevicePosition the span's blocks are scored, those not complete at
    the position masked. Of blocks tied at the last kept place (exactly 0: every head's q . k below
    0) the earlier are kept, whatever the length of the row scored: transformers' torch.topk over a
    query's complete blocks keeps an unspecified subset of them, which depends on that length."""

    def __init__(self, config: ModelConfig, weights: ModelWeights, prefix: str, rope: RotaryEmbedding,
                 dtype: torch.dtype) -> None:
        super().__init__(config, weights, prefix, rope, dtype)
        p = prefix + "indexer."
        self.index_qk = weights.get(p + "index_qk_proj.weight")
        self.index_q_norm, self.index_k_norm = weights.get(p + "q_layernorm.weight"), weights.get(p + "k_layernorm.weight")
        self.index_heads, self.index_head_dim = int(config.get("indexer_n_heads")), int(config.get("indexer_head_dim"))
        self.ratio = int(config.get("indexer_compress_ratio"))
        self.blocks_kept = int(config.get("indexer_budget")) // self.ratio

    def new_cache(self, max_tokens: int) -> QSACache:
        return QSACache(max_tokens, self.kv_heads, self.head_dim, self.index_head_dim, self.dtype)

    def __call__(self, x: torch.Tensor, positions: torch.Tensor, cache: QSACache, start: Start) -> torch.Tensor:
        t = x.shape[0]
        q, gate = linear(x, self.q, self.q_bias).view(t, self.heads, 2 * self.head_dim).chunk(2, dim=-1)
        k = linear(x, self.k, self.k_bias).view(t, self.kv_heads, self.head_dim)
        v = linear(x, self.v, self.v_bias).view(t, self.kv_heads, self.head_dim)
        q, k = rms_norm(q, self.q_norm, self.eps, offset=1.0), rms_norm(k, self.k_norm, self.eps, offset=1.0)
        cos, sin = self.rope(positions, x.dtype)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        keys, values = cache.append(start, k, v)
        index_q, index_k = linear(x, self.index_qk).split([self.index_heads * self.index_head_dim,
                                                           self.index_head_dim], dim=-1)
        raw_keys = store(cache.index_keys, start, index_k)
        length = keys.shape[0]
        if isinstance(start, int) and length // self.ratio <= self.blocks_kept:
            out = causal_attention(q, keys, values, start, self.scale)  # (every visible token is selected)
        else:
            index_q = rms_norm(index_q.view(t, self.index_heads, self.index_head_dim), self.index_q_norm, self.eps,
                               offset=1.0)
            visible = self.select(apply_rotary(index_q, cos, sin), raw_keys, positions, x.dtype)
            group = self.heads // self.kv_heads  # (SDPA in 4-D: the CPU flash kernel's form)
            out = F.scaled_dot_product_attention(
                q.transpose(0, 1)[None], keys.repeat_interleave(group, dim=1).transpose(0, 1)[None],
                values.repeat_interleave(group, dim=1).transpose(0, 1)[None], attn_mask=visible,
                scale=self.scale)[0].transpose(0, 1)
        return linear(out.reshape(t, -1) * torch.sigmoid(gate.reshape(t, -1)), self.o, self.o_bias)

    def select(self, q: torch.Tensor, raw_keys: torch.Tensor, positions: torch.Tensor,
               dtype: torch.dtype) -> torch.Tensor:
        """Which cached tokens each query attends to: [T, L] bool (q [T, h, D] normed and rotated)."""
        length, r, device = raw_keys.shape[0], self.ratio, raw_keys.device
        num_blocks = length // r
        tokens = torch.arange(length, device=device)
        complete = (positions.to(device)[:, None] + 1) // r  # [T, 1] blocks complete at each query
        causal = tokens[None, :] <= positions.to(device)[:, None]
        tail = tokens[None, :] >= complete * r
        if num_blocks == 0:
            return causal
        pooled = raw_keys[: num_blocks * r].view(num_blocks, r, -1).float().mean(dim=1).to(dtype)
        pooled = rms_norm(pooled, self.index_k_norm, self.eps, offset=1.0)
        cos, sin = self.rope(torch.arange(0, num_blocks * r, r, device=device), dtype)
        pooled = apply_rotary(pooled[:, None, :], cos, sin)[:, 0]  # [B, D]
        valid = torch.arange(num_blocks, device=device)[None, :] < complete  # [T, B]
        rows = max(1, SCORES_PER_CALL // (num_blocks * q.shape[1]))  # (a long prompt's queries a chunk at a time)
        kept = torch.cat([self.kept_blocks(q[i:i + rows], pooled, valid[i:i + rows]) for i in range(0, q.shape[0], rows)])
        block_of = (tokens // r).clamp(max=num_blocks - 1)
        in_kept = kept.gather(-1, block_of[None, :].expand(kept.shape[0], -1)) & (tokens < num_blocks * r)[None, :]
        return causal & (in_kept | tail)

    def kept_blocks(self, q: torch.Tensor, pooled: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        """[T, B] bool: the blocks each query keeps, of its `valid` (complete) ones."""
        scores = torch.relu(torch.einsum("thd,bd->tbh", q.float(), pooled.float())).sum(-1) / math.sqrt(q.shape[-1])
        # (of blocks tied at the last kept place the earlier stay, whatever the row's length: a block whose every
        # head scores below 0 scores exactly 0, so ties are common; torch.topk's choice among them varies with it)
        order = scores.masked_fill(~valid, float("-inf")).sort(dim=-1, descending=True, stable=True).indices
        top = order[:, : min(self.blocks_kept, valid.shape[1])]
        return torch.zeros_like(valid).scatter(-1, top, True) & valid


def deltanet(config: ModelConfig, weights: ModelWeights, prefix: str, dtype: torch.dtype) -> GatedDeltaNet:
    delta = GatedDeltaNet(config, weights, prefix, dtype)
    kind = config.get("output_gate_type") or config.get("hidden_act", "silu")
    if kind not in GATE_ACTIVATIONS:
        raise UnsupportedFamilyError(f"qwen4_exp output_gate_type {kind!r} is not one of {', '.join(GATE_ACTIVATIONS)}")
    delta.gate_activation = GATE_ACTIVATIONS[kind]
    return delta


def gated_residual(config: ModelConfig, weights: ModelWeights, prefix: str, *, inject: bool = True) -> GatedHyperConnection:
    return GatedHyperConnection(weights.get(prefix + "hc_norm.weight"), weights.get(prefix + "input_mix_weight_down.weight"),
                                weights.get(prefix + "input_mix_weight_up.weight"),
                                weights.get(prefix + "block_inject_weight.weight") if inject else None,
                                int(config.get("hc_count", 4)), config.rms_norm_eps)


def unnormed(x: torch.Tensor) -> torch.Tensor:
    return x  # (the gated residuals norm the streams; the sublayers read what they give)


def build(config: ModelConfig, weights: ModelWeights, executor: ExpertExecutor, dtype: torch.dtype) -> DecoderModel:
    if config.get("ple_layer_ids"):
        raise UnsupportedFamilyError(f"qwen4_exp ple_layer_ids {list(config.get('ple_layer_ids'))}: Per-Layer "
                                     "Embeddings (hashed n-gram tables) are not supported yet")
    types = layer_types(config)
    if "indexed_attention" in types and config.get("indexer_n_heads") is None:
        raise UnsupportedFamilyError("qwen4_exp indexed_attention layers without indexer_n_heads: every "
                                     "attention layer of Qwen4-Exp runs its QSA indexer")
    if "indexed_attention" in types and int(config.get("indexer_kv_heads") or 1) != 1:
        raise UnsupportedFamilyError("qwen4_exp indexer_kv_heads other than 1 (Qwen4ExpTextConfig requires 1)")
    rope = partial_rotary(config, 1.0)
    prefix = next((p for p in PREFIXES if weights.maybe(p + "embed_tokens.weight") is not None), PREFIXES[0])
    blocks = []
    for i, kind in enumerate(types):
        p = f"{prefix}layers.{i}."
        mixer: Mixer = (deltanet(config, weights, p + "linear_attn.", dtype) if kind == "linear_attention"
                        else QSAttention(config, weights, p + "self_attn.", rope, dtype))
        moe = NormalizedSharedExpertMoE(config, weights, i, p + "mlp.", executor)
        residuals = (gated_residual(config, weights, p + "attn_hyper_connection."),
                     gated_residual(config, weights, p + "mlp_hyper_connection."))
        blocks.append(Block(unnormed, mixer, unnormed, moe, residuals))
    head = GatedHyperHead(gated_residual(config, weights, prefix + "hyper_connection_mixer.", inject=False))
    return DecoderModel(config, weights, blocks, dtype, prefix=prefix, final_norm=unnormed, streams=head)
