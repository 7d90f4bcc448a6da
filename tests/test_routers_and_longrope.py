"""Phi-3.5-MoE's and DBRX's routing (runtime/layers/mlp.py) and LongRoPE's tables
(runtime/layers/rope.py) against transformers' own functions, on inputs the tiny parity models
do not reach: logits far apart and close together, p-norms other than DBRX's released 1, and
positions on both sides of the original context."""

from __future__ import annotations

import pytest
import torch

from runtime.layers.mlp import softmax_topk_pnorm, sparsemixer_top2
from runtime.layers.rope import RotaryEmbedding


@pytest.mark.parametrize("jitter_eps", [0.0, 0.01, 0.3, 2.0])
@pytest.mark.parametrize("scale", [0.05, 1.0, 20.0])
def test_sparsemixer_matches_transformers_at_inference(jitter_eps: float, scale: float) -> None:
    from transformers.models.phimoe.modeling_phimoe import sparsemixer

    gen = torch.Generator().manual_seed(int(scale * 100 + jitter_eps * 10))
    logits = torch.randn(64, 16, generator=gen) * scale
    logits[0, :4] = logits[0, 4]  # (ties: the first of the equals is chosen, as torch's max does)
    want_weights, want_ids = sparsemixer(logits, jitter_eps=jitter_eps, training=False)
    ids, weights = sparsemixer_top2(logits, jitter_eps)
    assert torch.equal(ids, want_ids)
    torch.testing.assert_close(weights, want_weights, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("p", [1.0, 2.0, None])
def test_dbrx_routing_matches_transformers(p: float | None) -> None:
    from transformers import DbrxConfig
    from transformers.models.dbrx.modeling_dbrx import DbrxFFN

    config = DbrxConfig(d_model=32, ffn_config=dict(ffn_hidden_size=16, moe_num_experts=8, moe_top_k=3,
                                                    moe_normalize_expert_weights=p))
    logits = torch.randn(40, 8, generator=torch.Generator().manual_seed(5)) * 3
    want_weights, want_ids = DbrxFFN(config).route_tokens_to_experts(logits)
    ids, weights = softmax_topk_pnorm(logits, 3, p)
    assert torch.equal(ids, want_ids)
    torch.testing.assert_close(weights, want_weights, rtol=1e-6, atol=1e-7)


def _phi_rope(**extra) -> dict:
    dim = 16
    return dict(rope_type="longrope", rope_theta=10000.0, original_max_position_embeddings=32,
                short_factor=[1.0 + 0.25 * i for i in range(dim // 2)], long_factor=[2.0 + 3 * i for i in range(dim // 2)],
                **extra)


@pytest.mark.parametrize("extra", [dict(short_mscale=1.1, long_mscale=1.4), {}], ids=["phi3.5-moe-mscales", "phi3-factor"])
def test_longrope_tables_on_both_sides_of_the_original_context(extra: dict) -> None:
    """Within the original context: `short_factor`; a call reaching past it: `long_factor`, for
    all its positions. The frequencies are transformers' (`_compute_longrope_parameters`, told the
    length); the scale is `short_mscale`/`long_mscale` where given (Phi-3.5-MoE), else
    transformers' attention factor from max_position_embeddings over the original context."""
    from transformers import PretrainedConfig
    from transformers.modeling_rope_utils import _compute_longrope_parameters

    params = _phi_rope(**extra)
    config = PretrainedConfig(hidden_size=64, num_attention_heads=4, max_position_embeddings=128,
                              rope_parameters=dict(params))
    rope = RotaryEmbedding(16, params, 128)
    for positions, long in ((torch.arange(0, 20), False), (torch.arange(0, 32), False), (torch.arange(0, 33), True),
                            (torch.tensor([40]), True), (torch.tensor([31]), False)):
        inv_freq, factor = _compute_longrope_parameters(config, seq_len=int(positions.max()) + 1)
        scale = extra.get("long_mscale" if long else "short_mscale", factor)
        angles = positions.float()[:, None] * inv_freq[None, :]
        cos, sin = rope(positions, torch.float32)
        torch.testing.assert_close(cos, torch.cat((angles, angles), dim=-1).cos() * scale)
        torch.testing.assert_close(sin, torch.cat((angles, angles), dim=-1).sin() * scale)
