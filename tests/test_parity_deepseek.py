"""DeepSeek-V3 and GLM-5 (glm_moe_dsa) against transformers, float32, on tiny random models.

As tests/test_parity.py: through ft's own pull path, logits within 1e-4 relative error, the same
32 greedy tokens with the KV cache, and the cached decode equal to a full recompute. The configs
cover both query paths (q_lora_rank set / None), group-limited routing (n_group > 1, topk_group
< n_group) with a correction bias that goes negative, norm_topk_prob both ways,
routed_scaling_factor != 1, leading dense layers, YaRN (mscale != mscale_all_dim, and the legacy
`rope_scaling` spelling), both rope layouts, and for GLM an index_topk well under the 44 tokens
of prompt + generation, with a "shared" indexer layer.

Weights are drawn wider than transformers' init (std 0.02) so attention is far from uniform and
a wrong rotation, scale or selection moves the logits well past the tolerance.
"""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from tests.checkpoints import load_all, to_fp8
from tests.parity import (
    assert_parity,
    convert_and_load,
    hf_logits,
    our_greedy,
    our_logits,
    rel_error,
)

STEPS = 32
PROMPT = [3, 17, 92, 45, 8, 200, 31, 7, 64, 128, 5, 11]
TOLERANCE = 1e-4

SMALL = dict(vocab_size=256, hidden_size=64, num_attention_heads=4, num_key_value_heads=4, num_experts_per_tok=2,
             intermediate_size=96, moe_intermediate_size=32, kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8,
             v_head_dim=16, n_shared_experts=1, initializer_range=0.15)
YARN = dict(rope_type="yarn", rope_theta=10000.0, factor=8.0, mscale=0.9, mscale_all_dim=1.3,
            original_max_position_embeddings=64, beta_fast=32, beta_slow=1)

CONFIGS: dict[str, tuple[str, dict]] = {
    # q_lora_rank path, 4 groups keep 2, renormalized, YaRN written the legacy way (rope_scaling)
    "deepseek-qlora-yarn": ("deepseek_v3", dict(
        SMALL, num_hidden_layers=3, q_lora_rank=32, n_routed_experts=8, n_group=4, topk_group=2,
        first_k_dense_replace=1, norm_topk_prob=True, routed_scaling_factor=2.5, rope_parameters=YARN,
        max_position_embeddings=512)),
    # plain q_proj, 2 groups keep 1, not renormalized, two dense layers, rotate-half rope
    "deepseek-qproj": ("deepseek_v3", dict(
        SMALL, num_hidden_layers=4, q_lora_rank=None, n_routed_experts=8, n_group=2, topk_group=1,
        first_k_dense_replace=2, norm_topk_prob=False, routed_scaling_factor=1.5, rope_interleave=False,
        n_shared_experts=2)),
    # DSA: 6 of up to 44 tokens per query; layer 2 reuses layer 1's selection
    "glm": ("glm_moe_dsa", dict(
        SMALL, num_hidden_layers=4, q_lora_rank=32, n_routed_experts=8, n_group=2, topk_group=1,
        first_k_dense_replace=1, norm_topk_prob=True, routed_scaling_factor=2.0, index_topk=6, index_head_dim=16,
        index_n_heads=16, indexer_types=["full", "full", "shared", "full"])),
    # DSA with YaRN, norm_topk_prob off, a single group; index_topk above the prompt's 12 tokens:
    # every token is kept until the 17th, then the selection starts
    "glm-yarn": ("glm_moe_dsa", dict(
        SMALL, num_hidden_layers=3, q_lora_rank=32, n_routed_experts=4, n_group=1, topk_group=1,
        first_k_dense_replace=1, norm_topk_prob=False, routed_scaling_factor=1.0, index_topk=16, index_head_dim=16,
        index_n_heads=8, rope_parameters=YARN, max_position_embeddings=512)),
    # two indexer heads: many tokens score exactly 0 after the relu and tie (test_dsa_ties_...)
    "glm-ties": ("glm_moe_dsa", dict(
        SMALL, num_hidden_layers=3, q_lora_rank=32, n_routed_experts=4, n_group=1, topk_group=1,
        first_k_dense_replace=1, index_topk=6, index_head_dim=16, index_n_heads=2)),
}
PARITY = ["deepseek-qlora-yarn", "deepseek-qproj", "glm", "glm-yarn"]


def save_model(name: str, out: Path, *, fused: bool = False, seed: int = 0) -> Path:
    """A random checkpoint of CONFIGS[name], with the parameters transformers inits to constants
    (correction bias, norm weights and biases) drawn at random too."""
    from transformers import AutoConfig, AutoModelForCausalLM

    family, config = copy.deepcopy(CONFIGS[name])
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(family, **config))
    with torch.no_grad():
        for param_name, param in model.named_parameters():
            if "norm" in param_name:
                param.copy_((1.0 if param_name.endswith("weight") else 0.0) + 0.2 * torch.randn_like(param))
        for buffer_name, buffer in model.named_buffers():
            if buffer_name.endswith("e_score_correction_bias"):
                # mostly negative choice scores: dropped groups must lose to them (-inf, not 0)
                buffer.copy_(0.6 * torch.randn_like(buffer) - 0.6)
    model.save_pretrained(out, **({"save_original_format": False} if fused else {}))
    if name == "deepseek-qlora-yarn":  # as DeepSeek's own config.json: rope_theta + rope_scaling with "type"
        path = out / "config.json"
        c = json.loads(path.read_text())
        rope = c.pop("rope_parameters")
        c["rope_theta"] = rope.pop("rope_theta")
        c["rope_scaling"] = {"type": rope.pop("rope_type"), **rope}
        path.write_text(json.dumps(c, indent=2))
    return out


def dequantized(fp8_dir: Path, out: Path) -> Path:
    """The FP8 checkpoint back in float32 (w = q * scale_inv per 128x128 block), the reference's input."""
    out.mkdir(parents=True)
    tensors = load_all(fp8_dir)
    plain = {}
    for name, t in tensors.items():
        if name.endswith("_scale_inv"):
            continue
        scale = tensors.get(name + "_scale_inv")
        if scale is not None:
            rows, cols = t.shape
            scale = scale.repeat_interleave(128, 0).repeat_interleave(128, 1)[:rows, :cols]
            t = t.to(torch.float32) * scale
        plain[name] = t
    save_file(plain, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((fp8_dir / "config.json").read_text())
    del config["quantization_config"]
    (out / "config.json").write_text(json.dumps(config, indent=2))
    return out


def hf_model(src: Path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32).eval()


def check_parity(ours, ref) -> None:
    assert_parity(ours, ref, PROMPT, STEPS, TOLERANCE)


@pytest.mark.parametrize("fused", [False, True], ids=["per-expert", "fused"])
@pytest.mark.parametrize("name", PARITY)
def test_logits_and_greedy_match_transformers(name: str, fused: bool, tmp_path: Path) -> None:
    src = save_model(name, tmp_path / "hf", fused=fused, seed=1)
    check_parity(convert_and_load(src, tmp_path / "store"), hf_model(src))


def test_deepseek_fp8_matches_transformers_on_the_dequantized_weights(tmp_path: Path) -> None:
    """FP8 block-scaled dense weights (dequantized at load) and experts (dequantized per use by
    the executor) give, in float32, exactly the values the reference reads, so the tolerance is
    the float32 one: only the order of operations differs."""
    fp8 = to_fp8(save_model("deepseek-qlora-yarn", tmp_path / "hf", seed=2), tmp_path / "fp8")
    ours, ref_dir = convert_and_load(fp8, tmp_path / "store"), dequantized(fp8, tmp_path / "ref")
    with ours.registered.open_ftw() as reader:
        assert {t.name: t.dtype for t in reader.index.tensors}["model.layers.1.self_attn.kv_b_proj.weight"] == "f8_e4m3"
    assert ours.weights.banks[1].layout.part("w13").dtype == "f8_e4m3"

    # bit for bit the weights the reference runs with
    ref_tensors = load_all(ref_dir)
    assert all(torch.equal(w, ref_tensors[name]) for name, w in ours.weights.dense.items())
    w13, w2 = ours.weights.banks[1].weights(3, torch.float32)
    expert = "model.layers.1.mlp.experts.3."
    assert torch.equal(w13, torch.cat([ref_tensors[expert + "gate_proj.weight"], ref_tensors[expert + "up_proj.weight"]]))
    assert torch.equal(w2, ref_tensors[expert + "down_proj.weight"])

    check_parity(ours, hf_model(ref_dir))


def test_dsa_ties_follow_transformers(tmp_path: Path) -> None:
    """With few indexer heads many tokens score exactly 0 and tie at the top-k boundary, and
    torch.topk orders ties differently in rows of different lengths: transformers' own cached
    decode then differs from its full recompute. We make the same top-k calls on the same rows,
    so our prefill matches its prefill and each cached step its cached step."""
    src = save_model("glm-ties", tmp_path / "hf", seed=1)
    ours, ref = convert_and_load(src, tmp_path / "store"), hf_model(src)
    assert rel_error(our_logits(ours, PROMPT), hf_logits(ref, PROMPT)) < TOLERANCE
    tokens, step_logits = our_greedy(ours, PROMPT, STEPS)
    with torch.no_grad():
        out = ref.generate(torch.tensor([PROMPT]), max_new_tokens=STEPS, min_new_tokens=STEPS, do_sample=False,
                           pad_token_id=0, eos_token_id=None, output_logits=True, return_dict_in_generate=True)
    assert tokens == out.sequences[0, len(PROMPT):].tolist()
    for ours_step, ref_step in zip(step_logits, out.logits, strict=True):
        assert rel_error(ours_step, ref_step[0].float()) < TOLERANCE
    full = our_logits(ours, PROMPT + tokens[:-1])
    assert max(rel_error(s, full[len(PROMPT) - 1 + i]) for i, s in enumerate(step_logits)) > 100 * TOLERANCE


def test_dsa_selection_changes_the_output(tmp_path: Path) -> None:
    """The GLM configs' index_topk really drops tokens: attending to all of them differs."""
    ours = convert_and_load(save_model("glm", tmp_path / "hf", seed=1), tmp_path / "store")
    ids = PROMPT * 3
    sparse = our_logits(ours, ids)
    for block in ours.model.blocks:
        if block.mixer.indexer is not None:
            block.mixer.indexer.topk = math.inf
    assert rel_error(our_logits(ours, ids), sparse) > 100 * TOLERANCE
