"""ZAYA's skip expert against transformers: a token whose router picks the class after the real
experts computes no expert (weight 0 on expert 0, as transformers masks it). The family's parity
test (tests/test_parity.py -k zaya) never routes there: transformers sets the skip class's
balancing bias to -1 on every load, which the random router's near-uniform probabilities never
overcome. Here every real expert's balancing bias is -1 too, so the choice is the probabilities'
own, and the skip class's row of the router's output is scaled up so that it wins some tokens."""

from __future__ import annotations

from pathlib import Path

import torch

from runtime.models.zaya import SkipExpertMoE
from tests.checkpoints import build_model
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
