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
    pytest.param("glm4_moe", False, id="glm4_moe"),
    pytest.param("qwen3_next", False, id="qwen3_next"),
    pytest.param("deepseek_v2", False, id="deepseek_v2"),
    pytest.param("qwen2_moe", False, id="qwen2_moe"),
    pytest.param("olmoe", False, id="olmoe"),
    pytest.param("minimax_m2", False, id="minimax_m2"),
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


def test_qwen3_moe_with_attention_biases_matches_transformers(tmp_path: Path) -> None:
    """attention_bias: q, k, v and o projections each have a bias (the o one was dropped)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from tests.checkpoints import FAMILY_CONFIGS

    torch.manual_seed(3)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model("qwen3_moe", **FAMILY_CONFIGS["qwen3_moe"],
                                                                  attention_bias=True))
    with torch.no_grad():  # (initialized to zero: a missing one would not show)
        for name, p in model.named_parameters():
            if name.endswith("_proj.bias"):
                p.normal_(0, 0.5)
    model.save_pretrained(tmp_path / "hf")
    ours = convert_and_load(tmp_path / "hf", tmp_path / "store")
    assert ours.weights.maybe("model.layers.0.self_attn.o_proj.bias") is not None
    assert_parity(ours, model.eval(), PROMPT, 8)


def test_qwen3_moe_with_a_sliding_window_is_refused_not_run_with_full_attention(tmp_path: Path) -> None:
    import json

    from runtime.models import UnsupportedFamilyError

    src = save_checkpoint("qwen3_moe", tmp_path / "hf", seed=1)
    config = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**config, "use_sliding_window": True, "sliding_window": 8}))
    with pytest.raises(UnsupportedFamilyError, match="sliding attention window"):
        convert_and_load(src, tmp_path / "store")


def test_glm4_moe_with_glms_own_config_layout_matches_transformers(tmp_path: Path) -> None:
    """GLM-4.5's config.json keeps `partial_rotary_factor` and `rope_theta` at the top level (not
    in transformers 5's `rope_parameters`), and its checkpoint carries a multi-token-prediction
    layer after `num_hidden_layers`, which is dropped. A factor other than the default 0.5 shows
    which one is read."""
    import json

    from safetensors.torch import load_file, save_file

    src = save_checkpoint("glm4_moe", tmp_path / "hf", seed=3)
    config = json.loads((src / "config.json").read_text())
    rope = config.pop("rope_parameters")
    config.update(rope_theta=rope["rope_theta"], partial_rotary_factor=0.25, num_nextn_predict_layers=1)
    (src / "config.json").write_text(json.dumps(config))
    shard = next(src.glob("*.safetensors"))
    tensors = load_file(shard)
    mtp = config["num_hidden_layers"]
    tensors[f"model.layers.{mtp}.eh_proj.weight"] = torch.zeros(config["hidden_size"], 2 * config["hidden_size"])
    save_file(tensors, str(shard), metadata={"format": "pt"})
    ref = hf_model(src)
    assert ref.model.rotary_emb.inv_freq.numel() == 16 * 0.25 // 2  # transformers read the factor too
    ours = convert_and_load(src, tmp_path / "store")
    assert_parity(ours, ref, PROMPT, STEPS)


def test_qwen3_next_drops_its_mtp_weights_and_matches_transformers(tmp_path: Path) -> None:
    """Qwen3-Next checkpoints carry multi-token-prediction weights under `mtp.`, which
    transformers' model has no place for; conversion drops them. (The tiny model's router
    renormalizes nothing, norm_topk_prob false, and has two value heads per key head: the
    grouped projections' regrouping is exercised.)"""
    from safetensors.torch import load_file, save_file

    src = save_checkpoint("qwen3_next", tmp_path / "hf", seed=4)
    shard = next(src.glob("*.safetensors"))
    tensors = load_file(shard)
    tensors["mtp.fc.weight"] = torch.zeros(64, 128)
    save_file(tensors, str(shard), metadata={"format": "pt"})
    ours = convert_and_load(src, tmp_path / "store")
    assert_parity(ours, hf_model(src), PROMPT, STEPS)


def test_deepseek_v2_with_group_limited_routing_matches_transformers(tmp_path: Path) -> None:
    """DeepSeek-V2 (not Lite) routes "group_limited_greedy": softmax scores, experts of all but the
    best `topk_group` groups zeroed (a group scores its best expert), no renormalization."""
    import json

    src = save_checkpoint("deepseek_v2", tmp_path / "hf", seed=5)
    config = json.loads((src / "config.json").read_text())
    config.update(topk_method="group_limited_greedy", n_group=4, topk_group=2)
    (src / "config.json").write_text(json.dumps(config))
    ours = convert_and_load(src, tmp_path / "store")
    assert_parity(ours, hf_model(src), PROMPT, STEPS)


def test_minimax_m2_with_a_correction_bias_and_its_released_config_matches_transformers(tmp_path: Path) -> None:
    """The released checkpoints name their partial RoPE `rotary_dim` (not partial_rotary_factor),
    and a nonzero correction bias changes which experts are chosen (not how they are weighed)."""
    import json

    from safetensors.torch import load_file, save_file

    src = save_checkpoint("minimax_m2", tmp_path / "hf", seed=6)
    config = json.loads((src / "config.json").read_text())
    rope = config.pop("rope_parameters")
    config.update(rope_theta=rope["rope_theta"], rotary_dim=4)  # a quarter of the 16-channel heads
    (src / "config.json").write_text(json.dumps(config))
    shard = next(src.glob("*.safetensors"))
    tensors = load_file(shard)
    gen = torch.Generator().manual_seed(6)
    biases = [n for n in tensors if n.endswith("e_score_correction_bias")]
    assert biases
    for name in biases:
        tensors[name] = torch.randn(tensors[name].shape, generator=gen)
    save_file(tensors, str(shard), metadata={"format": "pt"})
    ref = hf_model(src)
    assert ref.model.rotary_emb.inv_freq.numel() == 2  # transformers read rotary_dim too
    ours = convert_and_load(src, tmp_path / "store")
    assert_parity(ours, ref, PROMPT, STEPS)


def test_qwen2_moe_without_norm_topk_prob_in_its_config_renormalizes_nothing(tmp_path: Path) -> None:
    """Released Qwen1.5-MoE configs may leave norm_topk_prob out; transformers' default is False
    (Qwen3-Next's is True)."""
    import json

    src = save_checkpoint("qwen2_moe", tmp_path / "hf", seed=7)
    config = json.loads((src / "config.json").read_text())
    config.pop("norm_topk_prob", None)
    (src / "config.json").write_text(json.dumps(config))
    ours = convert_and_load(src, tmp_path / "store")
    assert_parity(ours, hf_model(src), PROMPT, STEPS)
