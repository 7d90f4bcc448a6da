"""gpt-oss beyond tests/test_parity.py's run of its tiny model (sliding and full layers, sinks,
biases, the clamped SwiGLU, YaRN): the released checkpoints' MXFP4 experts, the released
config's layout, and the GPU backend's handling of experts with biases.

As there: through ft's own pull path, logits within 1e-4 relative error in float32, the same 32
greedy tokens with the KV cache, and the cached decode equal to a full recompute.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.checkpoints import load_all, save_checkpoint, to_mxfp4
from tests.parity import assert_parity, convert_and_load, our_greedy, our_logits, rel_error
from tests.test_parity import PROMPT, STEPS, hf_model

pytest.importorskip("transformers")


def test_mxfp4_experts_convert_to_the_weights_transformers_dequantizes_and_match_it(tmp_path: Path) -> None:
    """The released experts are MXFP4 (`gate_up_proj_blocks`, `_scales`, ...): kept as GGML mxfp4
    records (DTYPE auto: 17 bytes a 32 values, a quarter of bf16's), they are bit for bit the
    weights transformers loads them as on the CPU (Mxfp4Config(dequantize=True)), with gate and
    up apart; then the model matches."""
    from transformers import AutoModelForCausalLM, Mxfp4Config

    src = to_mxfp4(save_checkpoint("gpt_oss", tmp_path / "hf", seed=1), tmp_path / "mxfp4")
    assert any(name.endswith("gate_up_proj_blocks") for name in load_all(src))
    ref = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32,
                                               quantization_config=Mxfp4Config(dequantize=True)).eval()
    ours = convert_and_load(src, tmp_path / "store")
    for layer, bank in ours.weights.banks.items():
        assert bank.layout.part("w13").dtype == bank.layout.part("w2").dtype == "mxfp4"
        experts = ref.model.layers[layer].mlp.experts  # gate_up_proj [E, H, 2I] (gate, up alternating), down [E, I, H]
        for e in range(bank.num_experts):
            w13, w2 = bank.weights(e, torch.float32)
            gate_up = experts.gate_up_proj[e].T
            assert torch.equal(w13, torch.cat([gate_up[0::2], gate_up[1::2]]))
            assert torch.equal(w2, experts.down_proj[e].T)
    assert_parity(ours, ref, PROMPT, STEPS)


def test_mxfp4_experts_asked_as_bf16_are_dequantized_exactly(tmp_path: Path) -> None:
    """DTYPE bf16 dequantizes the MXFP4 experts (exact in bf16): the same values as the kept records'."""
    from ftw import FTWReader, convert_checkpoint
    from runtime.experts.bank import HostExpertBank

    src = to_mxfp4(save_checkpoint("gpt_oss", tmp_path / "hf", seed=2), tmp_path / "mxfp4")
    kept, widened = convert_checkpoint(src, tmp_path / "kept"), convert_checkpoint(src, tmp_path / "bf16", dtype="bf16")
    assert {p.dtype for b in kept.banks for p in b.parts if p.name in ("w13", "w2")} == {"mxfp4"}
    assert {p.dtype for b in widened.banks for p in b.parts if p.name in ("w13", "w2")} == {"bf16"}
    assert sum(b.nbytes for b in kept.banks) < sum(b.nbytes for b in widened.banks) / 3
    readers = FTWReader.open(tmp_path / "kept"), FTWReader.open(tmp_path / "bf16")
    for a, b in zip(kept.banks, widened.banks, strict=True):
        banks = [HostExpertBank(x.layer, x, r.bank_bytes(x.layer)) for x, r in zip((a, b), readers, strict=True)]
        for e in range(a.num_experts):
            for mine, theirs in zip(banks[0].weights(e, torch.float32), banks[1].weights(e, torch.float32), strict=True):
                assert torch.equal(mine, theirs)


def test_the_released_config_layout_matches_transformers(tmp_path: Path) -> None:
    """gpt-oss-20b's config.json keeps `rope_theta` and YaRN's `rope_scaling` at the top level
    (transformers 4's spelling), gives no swiglu_alpha (GptOssConfig's 1.702) and adds keys of
    OpenAI's own (`experts_per_token`, `initial_context_length`)."""
    src = save_checkpoint("gpt_oss", tmp_path / "hf", seed=4)
    config = json.loads((src / "config.json").read_text())
    rope = config.pop("rope_parameters")
    del config["swiglu_alpha"]
    config.update(rope_theta=rope.pop("rope_theta"), rope_scaling=rope, experts_per_token=2,
                  initial_context_length=64)
    (src / "config.json").write_text(json.dumps(config))
    ref = hf_model(src)
    assert ref.config.rope_parameters["rope_type"] == "yarn" and ref.config.swiglu_alpha == 1.702
    ours = convert_and_load(src, tmp_path / "store")
    assert ours.weights.banks[0].layout.activation.alpha == 1.702
    assert [b.mixer.window for b in ours.model.blocks] == [5, None, 5]
    assert_parity(ours, ref, PROMPT, STEPS)


@pytest.mark.parametrize("mxfp4", [False, True], ids=["float", "mxfp4"])
@pytest.mark.parametrize("mode, slots", [("offload", 8), ("auto", 3), ("cpu", 8)])
def test_the_gpu_backend_gives_the_cpu_backends_tokens(mode: str, slots: int, mxfp4: bool, tmp_path: Path) -> None:
    """The hybrid executor (on the CPU device: the device paths' torch forms) computes gpt-oss's
    experts with their biases and clamped activation wherever they run: from cache slots
    ("offload"; "auto" with a cache smaller than a token's experts, misses split with the CPU) or
    all on the CPU ("cpu"). Same tokens and logits as the CPU backend, float experts or the
    release's MXFP4 kept as mxfp4 records."""
    from ftpull.pull import pull
    from registry import Store
    from runtime.loading.runnable import load

    store = Store(tmp_path / "store")
    src = save_checkpoint("gpt_oss", tmp_path / "hf", seed=2)
    name = str(pull(str(to_mxfp4(src, tmp_path / "mxfp4") if mxfp4 else src), store).name)
    reference = load(store, name, torch.float32)
    hybrid = load(store, name, torch.float32, mode=mode, backend="gpu", device="cpu", cache_slots=slots)
    tokens, logits = our_greedy(hybrid, PROMPT, 16)
    ref_tokens, ref_logits = our_greedy(reference, PROMPT, 16)
    assert tokens == ref_tokens
    for ours, ref in zip(logits, ref_logits, strict=True):
        assert rel_error(ours, ref) < 1e-5
    assert rel_error(our_logits(hybrid, PROMPT), our_logits(reference, PROMPT)) < 1e-5
