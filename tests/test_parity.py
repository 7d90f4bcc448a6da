"""Our runtime against transformers, float32, on tiny random models of every family.

Each model goes through ft's own pull path (HF checkpoint -> FTW -> registry) and is loaded by
the runtime; transformers loads the same checkpoint. Logits must agree to 1e-4 relative error,
greedy decoding with the KV cache must give the same 32 tokens, and the cached decode must equal
a full recompute.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.checkpoints import save_checkpoint
from tests.parity import assert_parity, convert_and_load

STEPS = 32
PROMPT = [3, 17, 92, 45, 8, 200, 31, 7, 64, 128, 5, 11]

FAMILIES = [
    pytest.param("qwen3_moe", False, id="qwen3_moe"),
    pytest.param("qwen3_moe", True, id="qwen3_moe-fused"),
    pytest.param("mixtral", False, id="mixtral"),
]


def hf_model(src: Path):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
    return model.eval()


@pytest.mark.parametrize("family, fused", FAMILIES)
def test_logits_and_greedy_match_transformers(family: str, fused: bool, tmp_path: Path) -> None:
    src = save_checkpoint(family, tmp_path / "hf", fused=fused, seed=1)
    ref = hf_model(src)
    ours = convert_and_load(src, tmp_path / "store")

    assert_parity(ours, ref, PROMPT, STEPS)
