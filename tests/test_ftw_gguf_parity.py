"""A GGUF, as llama.cpp's converter writes it, runs as its Hugging Face checkpoint does.

The tiny HF checkpoint of each family ft reads GGUF for is exported by `export_gguf`
(tests/test_ftw_gguf_hf.py, written apart from ftw/gguf_names.py and gguf_source.py), pulled
through ft's own pull path as a local .gguf file and run by the runtime; transformers runs the HF
checkpoint. Logits must agree and greedy decoding give the same tokens (tests/parity.py): that
checks the config the GGUF metadata implies as the runtime reads it, which comparing tensors and
the normalized config cannot.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.checkpoints import FAMILY_CONFIGS, RANDOMIZED, save_checkpoint
from tests.parity import assert_parity, convert_and_load
from tests.test_ftw_gguf_hf import ARCH, export_gguf
from tests.test_parity import PROMPT, STEPS, hf_model

# what a GGUF of the family cannot say otherwise, as its releases have it: llama.cpp's qwen3moe graph
# always renormalizes the top-k weights (its converter writes no key for it; Qwen3MoeConfig's default
# is False, the released models' True)
RELEASED = {"qwen3_moe": dict(norm_topk_prob=True)}
# correction biases transformers initializes to 0, drawn at random (tests/checkpoints.py RANDOMIZED) so
# that a bias lost or misplaced between GGUF and FTW changes the experts chosen
BIASED = ("deepseek_v3", "glm4_moe", "dots1", "minimax_m2")


@pytest.mark.parametrize("family", sorted(ARCH))
def test_gguf_generates_what_the_hf_checkpoint_does(family: str, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setitem(FAMILY_CONFIGS, family, {**FAMILY_CONFIGS[family], **RELEASED.get(family, {})})
    if family in BIASED:
        monkeypatch.setitem(RANDOMIZED, family, (*RANDOMIZED.get(family, ()), "e_score_correction_bias"))
    src = save_checkpoint(family, tmp_path / "hf", seed=1)
    path = export_gguf(src, tmp_path / "model.gguf")
    ours = convert_and_load(path, tmp_path / "store")
    assert_parity(ours, hf_model(src), PROMPT, STEPS)


def test_deepseek_v2_gguf_with_group_limited_routing_runs_as_transformers(tmp_path: Path, monkeypatch) -> None:
    """DeepSeek-V2's group_limited_greedy (V2 and V2.5, 8 groups keeping 3) comes back from the group keys."""
    grouped = dict(topk_method="group_limited_greedy", n_group=2, topk_group=1)
    monkeypatch.setitem(FAMILY_CONFIGS, "deepseek_v2", {**FAMILY_CONFIGS["deepseek_v2"], **grouped})
    src = save_checkpoint("deepseek_v2", tmp_path / "hf", seed=1)
    ours = convert_and_load(export_gguf(src, tmp_path / "model.gguf"), tmp_path / "store")
    assert ours.config.get("topk_method") == "group_limited_greedy"
    assert_parity(ours, hf_model(src), PROMPT, STEPS)
