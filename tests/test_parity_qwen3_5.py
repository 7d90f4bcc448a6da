"""Qwen3.5 MoE (Gated DeltaNet + gated attention) against transformers, float32, tiny random models.

Same bar as test_parity.py: logits within 1e-4 relative error, 32 identical greedy tokens with
our cached decode, and the cached decode equal to a full recompute. The prompt (150 tokens)
spans three 64-token DeltaNet chunks. Random init leaves every zero-centred norm at 0 and the
DeltaNet's output norm and dt_bias at 1, which would hide a missing (1 + w) or a wrong weight,
so those tensors are perturbed before the runtime and transformers load them.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from runtime.layers.gated_deltanet import DeltaNetState, gated_delta_rule
from runtime.layers.recurrent_state import RecurrentRewindError
from tests.checkpoints import QWEN3_5_TEXT, QWEN3_5_VISION, save_checkpoint
from tests.parity import (
    assert_parity,
    convert_and_load,
    our_logits,
    rel_error,
)

STEPS = 32
# no token 0: hf_greedy passes pad_token_id=0, and generate would mask prompt zeros as padding
PROMPT = torch.randint(1, 256, (150,), generator=torch.Generator().manual_seed(7)).tolist()

# the shape real releases have: M-RoPE keys in rope_parameters (text positions make them moot),
# 4 of 8 rotary channels per head, tied embeddings, one q/k head per two value heads
QWEN3_5_TEXT_MROPE = dict(
    QWEN3_5_TEXT, head_dim=32, tie_word_embeddings=True,
    initializer_range=0.1,  # at 0.02 a tied head mostly echoes the last token: a weak greedy check
    rope_parameters=dict(rope_type="default", rope_theta=10000.0, partial_rotary_factor=0.25,
                         mrope_section=[2, 1, 1], mrope_interleaved=True),
)


def perturb_norms(directory: Path, seed: int = 0) -> None:
    """Move every norm weight and dt_bias off its init value, in place."""
    generator = torch.Generator().manual_seed(seed)
    for file in sorted(directory.glob("*.safetensors")):
        tensors = load_file(file)
        for name, t in tensors.items():
            if name.endswith(("norm.weight", "dt_bias")):
                tensors[name] = t + 0.3 * torch.randn(t.shape, generator=generator, dtype=t.dtype)
        save_file(tensors, str(file), metadata={"format": "pt"})


def save_qwen3_5(out: Path, *, fused: bool, variant: str) -> Path:
    if variant == "default":
        save_checkpoint("qwen3_5_moe", out, fused=fused, seed=1)
    else:
        from transformers.models.qwen3_5_moe import Qwen3_5MoeConfig, Qwen3_5MoeForConditionalGeneration

        torch.manual_seed(2)
        config = Qwen3_5MoeConfig(text_config=QWEN3_5_TEXT_MROPE, vision_config=QWEN3_5_VISION,
                                  tie_word_embeddings=True)
        Qwen3_5MoeForConditionalGeneration(config).save_pretrained(out, **({"save_original_format": False} if fused else {}))
    perturb_norms(out)
    return out


def hf_model(src: Path):
    # the full multimodal class, fed input_ids only: exactly how the released checkpoints run text
    from transformers.models.qwen3_5_moe import Qwen3_5MoeForConditionalGeneration

    return Qwen3_5MoeForConditionalGeneration.from_pretrained(src, dtype=torch.float32).eval()


@pytest.mark.parametrize("fused, variant", [
    pytest.param(False, "default", id="per-expert"),
    pytest.param(True, "default", id="fused"),
    pytest.param(False, "mrope-tied", id="mrope-tied"),
])
def test_logits_and_greedy_match_transformers(fused: bool, variant: str, tmp_path: Path) -> None:
    src = save_qwen3_5(tmp_path / "hf", fused=fused, variant=variant)
    ref = hf_model(src)
    ours = convert_and_load(src, tmp_path / "store")

    assert_parity(ours, ref, PROMPT, STEPS)  # the cached decode is the recurrent DeltaNet step

    # a prefill in pieces that do not end on chunk or conv boundaries carries both states across
    state = ours.model.new_state(len(PROMPT))
    pieces = [ours.model.forward(torch.tensor(PROMPT[a:b]), state) for a, b in ((0, 37), (37, 101), (101, 150))]
    assert rel_error(torch.cat(pieces), our_logits(ours, PROMPT)) < 1e-4


def test_chunked_rule_equals_token_by_token() -> None:
    g = torch.Generator().manual_seed(0)
    t, k_heads, v_heads, dim = 150, 2, 4, 16
    q, k = (torch.randn(t, k_heads, dim, generator=g) for _ in range(2))
    v = torch.randn(t, v_heads, dim, generator=g)
    decay = -torch.rand(t, v_heads, generator=g)
    beta = torch.rand(t, v_heads, generator=g)
    state = torch.randn(v_heads, dim, dim, generator=g)
    chunked, chunked_state = gated_delta_rule(q, k, v, decay, beta, state, chunked=True)
    stepped, stepped_state = gated_delta_rule(q, k, v, decay, beta, state, chunked=False)
    assert rel_error(chunked, stepped) < 1e-5
    assert rel_error(chunked_state, stepped_state) < 1e-5


def test_recurrent_state_cannot_rewind() -> None:
    state = DeltaNetState(torch.ones(4, 3), torch.ones(2, 4, 4), length=10)
    with pytest.raises(RecurrentRewindError, match="cannot continue from token 5"):
        state.seek(5)
    state.seek(0)  # a new sequence starts from zeros
    assert not state.conv.any() and not state.recurrent.any()
