"""Granite 4.0 hybrid (granitemoehybrid) against transformers beyond the common parity run
(tests/test_parity.py): the releases' own layer-type names, rope attention, a prompt over many
Mamba2 chunks, and the Mamba2 state saved and put back as a session does (DecoderModel.checkpoint)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.checkpoints import save_checkpoint
from tests.parity import assert_parity, convert_and_load
from tests.test_parity import PROMPT, STEPS, hf_model

pytest.importorskip("transformers")


def _with_config(src: Path, **changes) -> Path:
    config = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**config, **changes}))
    return src


def test_the_releases_layer_type_names_match_transformers(tmp_path: Path) -> None:
    """config.json as the releases write it ("mamba" and "attention", which transformers >= 5 reads as
    linear_attention and full_attention; save_pretrained writes the new names)."""
    src = save_checkpoint("granitemoehybrid", tmp_path / "hf", seed=7)
    assert json.loads((src / "config.json").read_text())["layer_types"][1] == "full_attention"
    _with_config(src, layer_types=["mamba", "attention", "mamba", "mamba"])
    ref = hf_model(src)
    assert ref.model.layers[1].self_attn is not None and ref.model.layers[2].mamba is not None
    assert_parity(convert_and_load(src, tmp_path / "store"), ref, PROMPT, STEPS)


def test_rope_attention_matches_transformers(tmp_path: Path) -> None:
    src = _with_config(save_checkpoint("granitemoehybrid", tmp_path / "hf", seed=8), position_embedding_type="rope")
    ref = hf_model(src)
    assert ref.model.rotary_emb is not None
    assert_parity(convert_and_load(src, tmp_path / "store"), ref, PROMPT, STEPS)


def test_a_prompt_over_many_chunks_matches_transformers(tmp_path: Path) -> None:
    """45 tokens in Mamba2 chunks of 8 (the last one short): the scan carries the state from chunk to
    chunk, and decoding continues it."""
    src = save_checkpoint("granitemoehybrid", tmp_path / "hf", seed=9)
    assert_parity(convert_and_load(src, tmp_path / "store"), hf_model(src), (PROMPT * 4)[:45], 8)


@pytest.fixture(scope="module")
def hybrid(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("granitemoehybrid")
    loaded = convert_and_load(save_checkpoint("granitemoehybrid", root / "hf", seed=3), root / "store")
    assert not loaded.model.rewinds
    return loaded.model


def test_the_mamba2_state_is_saved_and_put_back(hybrid) -> None:
    """A checkpoint's host copies put back give the continuation the state had when saved."""
    state = hybrid.new_state(64)
    hybrid.forward(torch.tensor(PROMPT), state)
    saved = hybrid.checkpoint(state)
    assert saved is not None and sorted(saved.caches) == [0, 2, 3]
    first = hybrid.forward(torch.tensor([5, 6, 7]), state)
    hybrid.forward(torch.tensor([9, 9]), state)  # another continuation moves the state on
    hybrid.restore(state, saved)
    assert state.length == len(PROMPT)
    torch.testing.assert_close(hybrid.forward(torch.tensor([5, 6, 7]), state), first, rtol=0, atol=0)


def test_a_departing_prompt_is_taken_back_to_the_saved_state(hybrid) -> None:
    """The engine's recurrent-state test (tests/test_recurrent_checkpoints.py) on this family."""
    from tests.test_recurrent_checkpoints import (
        test_a_departing_prompt_is_taken_back_to_the_saved_state as departing,
    )

    departing(hybrid)
