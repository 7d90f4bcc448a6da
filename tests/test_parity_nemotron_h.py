"""NVIDIA Nemotron-H (nemotron_h) against transformers 5.25's torch path: Mamba2, NoPE attention, MoE
with relu2 experts (not gated) and a dense relu2 MLP layer, one a layer as the pattern says; the
release's config (hybrid_override_pattern, num_hidden_layers) and transformers' fused experts; a
prompt over many Mamba2 chunks; the Mamba2 state saved and put back as a session does."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.checkpoints import save_checkpoint
from tests.parity import assert_parity, convert_and_load
from tests.test_parity import PROMPT, STEPS, hf_model

pytest.importorskip("transformers")


@pytest.mark.parametrize("fused", [False, True], ids=["per-expert", "fused"])
def test_logits_and_greedy_match_transformers(fused: bool, tmp_path: Path) -> None:
    src = save_checkpoint("nemotron_h", tmp_path / "hf", fused=fused, seed=1)
    from safetensors import safe_open

    with safe_open(src / "model.safetensors", "pt") as f:  # (the release's names, or transformers' own fused ones)
        names = list(f.keys())
    ours = convert_and_load(src, tmp_path / "store")
    bank = ours.weights.banks[1].layout
    assert sorted(ours.weights.banks) == [1, 3, 6]
    assert bank.activation.kind == "relu2" and bank.part("w13").shape == (32, 64)  # the up rows alone
    assert any(n.startswith("backbone.") for n in names) is not fused
    assert any(n.endswith("mixer.experts.up_proj") for n in names) is fused
    assert_parity(ours, hf_model(src), PROMPT, STEPS)


def test_the_releases_config_matches_transformers(tmp_path: Path) -> None:
    """config.json as the releases write it: hybrid_override_pattern and num_hidden_layers, no
    layers_block_type (transformers 5 saves that instead)."""
    src = save_checkpoint("nemotron_h", tmp_path / "hf", seed=2)
    config = json.loads((src / "config.json").read_text())
    del config["layers_block_type"]
    config.update(hybrid_override_pattern="ME*E-ME", num_hidden_layers=7)
    (src / "config.json").write_text(json.dumps(config))
    assert_parity(convert_and_load(src, tmp_path / "store"), hf_model(src), PROMPT, STEPS)


def test_a_prompt_over_many_chunks_matches_transformers(tmp_path: Path) -> None:
    """45 tokens in Mamba2 chunks of 8 (the last one short), then decoding continues the state."""
    src = save_checkpoint("nemotron_h", tmp_path / "hf", seed=9)
    assert_parity(convert_and_load(src, tmp_path / "store"), hf_model(src), (PROMPT * 4)[:45], 8)


@pytest.fixture(scope="module")
def nemotron(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("nemotron_h")
    loaded = convert_and_load(save_checkpoint("nemotron_h", root / "hf", seed=3), root / "store")
    assert not loaded.model.rewinds
    return loaded.model


def test_the_mamba2_state_is_saved_and_put_back(nemotron) -> None:
    """A checkpoint's host copies put back give the continuation the state had when saved."""
    state = nemotron.new_state(64)
    nemotron.forward(torch.tensor(PROMPT), state)
    saved = nemotron.checkpoint(state)
    assert saved is not None and sorted(saved.caches) == [0, 5]
    first = nemotron.forward(torch.tensor([5, 6, 7]), state)
    nemotron.forward(torch.tensor([9, 9]), state)  # another continuation moves the state on
    nemotron.restore(state, saved)
    assert state.length == len(PROMPT)
    torch.testing.assert_close(nemotron.forward(torch.tensor([5, 6, 7]), state), first, rtol=0, atol=0)


def test_a_departing_prompt_is_taken_back_to_the_saved_state(nemotron) -> None:
    """The engine's recurrent-state test (tests/test_recurrent_checkpoints.py) on this family."""
    from tests.test_recurrent_checkpoints import (
        test_a_departing_prompt_is_taken_back_to_the_saved_state as departing,
    )

    departing(nemotron)
