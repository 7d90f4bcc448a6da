"""A random Qwen3-MoE in memory, for tests and benchmarks that need a whole model without a
checkpoint: its dense weights by Hugging Face name, its config, and random expert banks."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..config import ModelConfig
from ..experts.synthetic import random_bank
from ..loading.read_ftw import ModelWeights


@dataclass(frozen=True)
class Qwen3MoeShape:
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    experts: int
    top_k: int
    inter: int
    vocab: int
    layers: int


def random_dense(shape: Qwen3MoeShape, dtype: torch.dtype, gen: torch.Generator, *, device: str = "cpu",
                 std: float = 0.02, embed_std: float = 1.0) -> dict[str, torch.Tensor]:
    """Every dense tensor, Gaussian of `std` (the embedding `embed_std`, routers 1.0), norms 1."""
    def rand(*dims: int, scale: float = std) -> torch.Tensor:
        return (torch.randn(*dims, generator=gen) * scale).to(device, dtype)

    def ones(n: int) -> torch.Tensor:
        return torch.ones(n, dtype=dtype, device=device)

    s = shape
    dense = {"model.embed_tokens.weight": rand(s.vocab, s.hidden, scale=embed_std), "lm_head.weight": rand(s.vocab, s.hidden),
             "model.norm.weight": ones(s.hidden)}
    for i in range(s.layers):
        p = f"model.layers.{i}."
        dense |= {p + "self_attn.q_proj.weight": rand(s.heads * s.head_dim, s.hidden),
                  p + "self_attn.k_proj.weight": rand(s.kv_heads * s.head_dim, s.hidden),
                  p + "self_attn.v_proj.weight": rand(s.kv_heads * s.head_dim, s.hidden),
                  p + "self_attn.o_proj.weight": rand(s.hidden, s.heads * s.head_dim),
                  p + "self_attn.q_norm.weight": ones(s.head_dim), p + "self_attn.k_norm.weight": ones(s.head_dim),
                  p + "input_layernorm.weight": ones(s.hidden), p + "post_attention_layernorm.weight": ones(s.hidden),
                  p + "mlp.gate.weight": rand(s.experts, s.hidden, scale=1.0)}
    return dense


def qwen3_moe_config(shape: Qwen3MoeShape, context_length: int) -> ModelConfig:
    s = shape
    return ModelConfig(family="qwen3_moe", num_layers=s.layers, hidden_size=s.hidden, vocab_size=s.vocab,
                       num_attention_heads=s.heads, num_key_value_heads=s.kv_heads, head_dim=s.head_dim,
                       num_experts=s.experts, num_experts_per_tok=s.top_k, moe_intermediate_size=s.inter,
                       moe_layers=tuple(range(s.layers)), context_length=context_length, tie_word_embeddings=False,
                       source={"rope_theta": 1e6, "rms_norm_eps": 1e-6, "norm_topk_prob": True})


def random_qwen3_moe(shape: Qwen3MoeShape, dtype: str, *, context_length: int = 8192, std: float = 0.02,
                     num_distinct: int | None = None, seed: int = 0) -> ModelWeights:
    """A whole random model on the host: dense weights (`random_dense`), banks of `dtype`."""
    dt = {"bf16": torch.bfloat16, "f32": torch.float32}[dtype]
    dense = random_dense(shape, dt, torch.Generator().manual_seed(seed), std=std)
    banks = {i: random_bank(dtype, shape.experts, shape.hidden, shape.inter, layer=i, seed=i, num_distinct=num_distinct)
             for i in range(shape.layers)}
    return ModelWeights(qwen3_moe_config(shape, context_length), dense, banks)
