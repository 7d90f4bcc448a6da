"""ZAYA beyond the family's parity test (tests/test_parity.py -k zaya): its skip expert against
transformers, and what its build refuses by name.

The skip expert: a token whose router picks the class after the real experts computes no expert
(weight 0 on expert 0, as transformers masks it). The parity test never routes there: transformers
sets the skip class's balancing bias to -1 on every load, which the random router's near-uniform
probabilities never overcome. Here every real expert's balancing bias is -1 too, so the choice is
the probabilities' own, and the skip class's row of the router's output is scaled up so that it
wins some tokens."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch

from runtime.config import ModelConfig, UnsupportedFamilyError
from runtime.models.zaya import SkipExpertMoE, check
from tests.checkpoints import build_model, save_checkpoint
from tests.parity import assert_parity, convert_and_load
from tests.test_parity import PROMPT, STEPS


def test_tokens_the_router_sends_to_the_skip_expert_match_transformers(tmp_path: Path) -> None:
    model = build_model("zaya", seed=5)
    experts = model.config.num_experts
    with torch.no_grad():
        for name, buffer in model.named_buffers():
            if name.endswith("balancing_biases"):
                buffer.fill_(-1.0)  # (the skip class's is -1 whatever the checkpoint holds)
        for name, p in model.named_parameters():
            if name.endswith("router_mlp.out_proj.weight"):
                p[experts] *= 4.0  # the skip class's logit row
    model.save_pretrained(tmp_path / "hf")
    ours = convert_and_load(tmp_path / "hf", tmp_path / "store")

    routed: list[tuple[int, int]] = []  # (tokens, of which skipped) a call
    moes = [b.ffn for b in ours.model.blocks if isinstance(b.ffn, SkipExpertMoE)]
    assert moes
    for moe in moes:
        def counting(layer, x, ids, weights, run=moe.executor):
            routed.append((ids.shape[0], int((weights == 0).sum())))
            return run(layer, x, ids, weights)
        moe.executor = counting

    assert_parity(ours, model.eval(), PROMPT, STEPS)
    skipped = sum(s for _, s in routed)
    assert 0 < skipped < sum(t for t, _ in routed), routed


@pytest.mark.parametrize("change, refusal", [
    ({"hidden_act": "gelu"}, "another hidden_act than silu"),
    ({"num_experts_per_tok": 2}, "num_experts_per_tok other than 1"),
    ({"layer_types": ["hybrid", "mamba", "hybrid"]}, "mamba"),
    ({"sliding_window": None}, "hybrid_sliding layers needs a sliding_window"),
    ({"moe_layers": (0, 2)}, "a MoE on every layer"),
])
def test_what_zayas_build_refuses_is_named(change: dict, refusal: str, tmp_path: Path) -> None:
    """An activation other than silu, two experts a token (its skip expert is a top-1 rule, as
    ZayaConfig says), a layer kind it has no mixer for, sliding layers without a window, a layer
    without the MoE whose router state the next one reads: each refused by name."""
    ours = convert_and_load(save_checkpoint("zaya", tmp_path / "hf", seed=1), tmp_path / "store")
    config: ModelConfig = ours.config
    check(config)  # (the checkpoint as saved: nothing refused)
    fields = {k: v for k, v in change.items() if k in ("num_experts_per_tok", "moe_layers")}
    source = {k: v for k, v in change.items() if k not in fields}
    changed = replace(config, **fields, source={**config.source, **source})
    with pytest.raises(UnsupportedFamilyError, match=refusal):
        check(changed)
