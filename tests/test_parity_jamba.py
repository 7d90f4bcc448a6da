"""AI21 Jamba (jamba) against transformers 5.25's torch path (JambaMambaMixer without the
mamba-ssm kernels): the release's per-expert names and transformers' fused ones, JambaConfig's own
layer schedule, a prompt over several scan blocks, and the Mamba state saved and put back as a
session does (DecoderModel.checkpoint)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from runtime.layers import mamba
from tests.checkpoints import load_all, save_checkpoint
from tests.parity import assert_parity, convert_and_load
from tests.test_parity import PROMPT, STEPS, hf_model

pytest.importorskip("transformers")


@pytest.mark.parametrize("fused", [False, True], ids=["per-expert", "fused"])
def test_logits_and_greedy_match_transformers(fused: bool, tmp_path: Path) -> None:
    """Logits to 1e-4 in f32, 32 greedy tokens, cached decode = recompute; the release's
    feed_forward.experts.N.gate_proj names (save_pretrained's original format) or transformers' fused."""
    src = save_checkpoint("jamba", tmp_path / "hf", fused=fused)
    names = load_all(src)
    assert ("model.layers.1.feed_forward.experts.gate_up_proj" in names) == fused
    assert ("model.layers.3.feed_forward.experts.0.gate_proj.weight" in names) != fused
    ref = hf_model(src)
    assert ref.config.layers_block_type == ["mamba", "attention", "mamba", "mamba", "attention"]
    assert ref.config.layers_num_experts == [1, 4, 1, 4, 1]
    assert_parity(convert_and_load(src, tmp_path / "store"), ref, PROMPT, STEPS)


def test_jambas_default_schedule_matches_transformers(tmp_path: Path) -> None:
    """JambaConfig's defaults left out of config.json (attention every 8th layer from 4, the MoE
    every 2nd from 1, dt rank "auto"), as the releases' schedule is."""
    src = save_checkpoint("jamba", tmp_path / "hf", seed=5)
    config = json.loads((src / "config.json").read_text())
    for key in ("attn_layer_period", "attn_layer_offset", "expert_layer_period", "expert_layer_offset"):
        config.pop(key)
    # (the tensors as the defaults lay them out: the saved ones are another schedule's)
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(5)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**{**config, "num_hidden_layers": 6}))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if any(part in name for part in ("layernorm.", "mamba.D", "conv1d.bias", "dt_proj.bias")):
                p.normal_(0.0 if name.endswith(".bias") else 1.0, 0.2)
    model.save_pretrained(tmp_path / "default")
    ref = hf_model(tmp_path / "default")
    assert ref.config.layers_block_type[4] == "attention" and ref.config.layers_num_experts[5] == 4
    assert_parity(convert_and_load(tmp_path / "default", tmp_path / "store"), ref, PROMPT, 8)


def test_a_prompt_over_several_scan_blocks_matches_transformers(tmp_path: Path, monkeypatch) -> None:
    """45 tokens scanned in blocks of 8 (the last one short): the state carries from block to block."""
    monkeypatch.setattr(mamba, "SCAN_BLOCK_TOKENS", 8)
    src = save_checkpoint("jamba", tmp_path / "hf", seed=9)
    assert_parity(convert_and_load(src, tmp_path / "store"), hf_model(src), (PROMPT * 4)[:45], 8)


@pytest.fixture(scope="module")
def jamba_model(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("jamba")
    loaded = convert_and_load(save_checkpoint("jamba", root / "hf", seed=3), root / "store")
    assert not loaded.model.rewinds
    return loaded.model


def test_a_prompt_in_two_calls_continues_the_state(jamba_model) -> None:
    """A prompt given in two calls (a chunked prefill, a conversation's next turn) scans on from the
    state the first left (transformers' prompt path would start its scan from zero)."""
    whole = jamba_model.forward(torch.tensor(PROMPT), jamba_model.new_state(64))
    state = jamba_model.new_state(64)
    first = jamba_model.forward(torch.tensor(PROMPT[:5]), state)
    rest = jamba_model.forward(torch.tensor(PROMPT[5:]), state)
    torch.testing.assert_close(torch.cat([first, rest]), whole, rtol=1e-5, atol=1e-5)


def test_the_mamba_state_is_saved_and_put_back(jamba_model) -> None:
    """A checkpoint's host copies put back give the continuation the state had when saved."""
    state = jamba_model.new_state(64)
    jamba_model.forward(torch.tensor(PROMPT), state)
    saved = jamba_model.checkpoint(state)
    assert saved is not None and sorted(saved.caches) == [0, 2, 3]
    first = jamba_model.forward(torch.tensor([5, 6, 7]), state)
    jamba_model.forward(torch.tensor([9, 9]), state)  # another continuation moves the state on
    jamba_model.restore(state, saved)
    assert state.length == len(PROMPT)
    torch.testing.assert_close(jamba_model.forward(torch.tensor([5, 6, 7]), state), first, rtol=0, atol=0)


def test_a_mamba_state_does_not_rewind(jamba_model) -> None:
    from runtime.layers.recurrent_state import RecurrentRewindError

    state = jamba_model.new_state(64)
    jamba_model.forward(torch.tensor(PROMPT), state)
    state.length = 4  # (the position, not the caches: a Mamba state cannot follow it back)
    with pytest.raises(RecurrentRewindError, match="Mamba state"):
        jamba_model.forward(torch.tensor([5]), state)
