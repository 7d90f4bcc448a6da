"""`ft fit` and the pull-time check know the footprint of the families added from transformers
5.25's list: the estimate made before any download (config.json and the safetensors headers)
equals the converted model's, and the KV cache fit plans a token is what the runtime allocates."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from ftw import convert_checkpoint
from ftw.safetensors_source import SafetensorsCheckpoint
from runtime.planner.footprint import ModelFootprint
from tests.checkpoints import save_checkpoint
from tests.parity import convert_and_load

pytest.importorskip("transformers")

FAMILIES = [pytest.param("sarvam_moe", False, id="sarvam_moe"), pytest.param("sarvam_moe", True, id="sarvam_moe-fused"),
            pytest.param("qwen4_exp", False, id="qwen4_exp"),
            pytest.param("granitemoe_swa", False, id="granitemoe_swa"), pytest.param("minicpm5_moe", True, id="minicpm5_moe-fused"),
            pytest.param("granitemoehybrid", False, id="granitemoehybrid"), pytest.param("jamba", False, id="jamba"),
            pytest.param("jamba", True, id="jamba-fused"), pytest.param("axk1", False, id="axk1"),
            pytest.param("hy_v3", False, id="hy_v3"), pytest.param("mellum", True, id="mellum-fused"),
            pytest.param("mistral4", False, id="mistral4"), pytest.param("mistral4", True, id="mistral4-fused"),
            pytest.param("gemma4_text", False, id="gemma4_text"), pytest.param("nemotron_h", False, id="nemotron_h"),
            pytest.param("nemotron_h", True, id="nemotron_h-fused"), pytest.param("longcat_flash", False, id="longcat_flash"),
            pytest.param("longcat_flash", True, id="longcat_flash-fused"), pytest.param("flint", False, id="flint"),
            pytest.param("flint", True, id="flint-fused"), pytest.param("kolibri1", False, id="kolibri1"),
            pytest.param("kolibri1", True, id="kolibri1-fused"), pytest.param("axk2", False, id="axk2"),
            pytest.param("axk2", True, id="axk2-fused"), pytest.param("beam", False, id="beam"),
            pytest.param("beam", True, id="beam-fused"), pytest.param("ergo", False, id="ergo"),
            pytest.param("ergo", True, id="ergo-fused"), pytest.param("doge", False, id="doge"),
            pytest.param("hy_v4", False, id="hy_v4"), pytest.param("hy_v4", True, id="hy_v4-fused"),
            pytest.param("zaya", False, id="zaya"), pytest.param("lara_mini", False, id="lara_mini"),
            pytest.param("lara_mini", True, id="lara_mini-fused")]
MAX_TOKENS = 40


def state_bytes(cache: object) -> int:
    """The bytes of the tensors a layer's cache holds (none: a layer without a mixer, Nemotron-H's MoE layers),
    those of the caches within it too (DSA's: its MLA cache beside the indexer's keys)."""
    if cache is None:
        return 0
    return sum(t.numel() * t.element_size() if isinstance(t, torch.Tensor) else state_bytes(t)
               for t in vars(cache).values() if isinstance(t, torch.Tensor) or hasattr(t, "__dict__"))


@pytest.mark.parametrize("family, fused", FAMILIES)
def test_checkpoint_estimate_matches_the_ftw_index(family: str, fused: bool, tmp_path: Path) -> None:
    src = save_checkpoint(family, tmp_path / "hf", fused=fused)
    config = json.loads((src / "config.json").read_text())
    with SafetensorsCheckpoint(src) as ckpt:
        tensors = {name: (t.dtype, t.nbytes) for name, t in ckpt.tensors.items()}
    before = ModelFootprint.from_checkpoint(config, tensors)
    after = ModelFootprint.from_index(convert_checkpoint(src, tmp_path / "ftw"))
    assert replace(before, source="ftw") == after


@pytest.mark.parametrize("family, fused", FAMILIES)
def test_planned_kv_is_what_the_runtime_allocates(family: str, fused: bool, tmp_path: Path) -> None:
    loaded = convert_and_load(save_checkpoint(family, tmp_path / "hf", fused=fused), tmp_path / "store")
    kv = ModelFootprint.from_index(loaded.registered.open_ftw().index).kv
    allocated = sum(state_bytes(c) for c in loaded.model.new_state(MAX_TOKENS).caches)
    assert kv.bytes_per_token * MAX_TOKENS + kv.state_bytes == allocated
