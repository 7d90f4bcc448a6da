"""Moonshot's Kimi Linear (kimi_linear) as a GGUF file (`kimi-linear`), written the way llama.cpp's converter writes
it (conversion/kimi_linear.py at llama.cpp 0c1e570: KimiLinearModel), pulled through ft and run against transformers.

The converter reads the release's config (linear_attn_config with full_attn_layers, kda_layers, head_dim,
num_heads and short_conv_kernel_size; num_experts, num_experts_per_token, num_expert_group, topk_group,
num_shared_experts, first_k_dense_replace, moe_router_activation_func, model_max_length) and the release's
tensor names (the dense first layer under mlp., the MoE under block_sparse_moe). `export_kimi_linear_gguf`
writes what it writes from the release config that the tiny transformers checkpoint stands for: the base keys
(head_count_kv 1 and then one a layer, 0 on the KDA layers and 1 on the MLA ones; key_length and value_length
head_dim, key_length then kv_lora_rank + qk_rope_head_dim; expert_group_used_count from topk_group, no group
count; expert_gating_func sigmoid), KimiLinearModel's (ssm.conv_kernel, kda.head_dim, q_lora_rank, kv_lora_rank,
rope.dimension_count, key_length_mla, value_length_mla, the expert width, shared count, leading dense blocks,
expert_weights_scale), and the tensors as modify_tensors leaves them: the q/k/v convs [C, 1, K] reshaped
[1, C, 1, K], A_log as -exp(A_log), dt_bias renamed dt_proj.bias, kv_b split into k_b (transposed) and v_b,
the experts stacked per layer, the correction bias renamed; a byte-level vocabulary padded.
"""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import pytest
import torch
from gguf.constants import MODEL_ARCH

from ftw import FTWReader, convert_checkpoint
from ftw.errors import SourceError, UnsupportedArchitectureError
from ftw.gguf_convert import convert_gguf
from runtime.loading.family_tensors import check_family_tensors
from tests import checkpoints
from tests.checkpoints import load_all, save_checkpoint
from tests.gguf_export import add_padded_vocab, config_differences
from tests.parity import assert_parity, convert_and_load
from tests.test_ftw_gguf_hf import _gguf_name, collect_expert, write_gguf
from tests.test_parity import PROMPT, STEPS, hf_model

pytest.importorskip("transformers")

ARCH = gguf.MODEL_ARCH_NAMES[MODEL_ARCH.KIMI_LINEAR]


def export_kimi_linear_gguf(src: Path, out: Path, *, gating: gguf.ExpertGatingFuncType | None =
                            gguf.ExpertGatingFuncType.SIGMOID, scale: bool = True, drop: str | None = None) -> Path:
    """The file KimiLinearModel writes from the release config the checkpoint stands for; `gating` the
    expert_gating_func (None: no key), without `scale` no expert_weights_scale, `drop` a tensor (a kv_b half
    among them) left out."""
    c = json.loads((src / "config.json").read_text())
    layers = c["num_hidden_layers"]
    full = [t == "full_attention" for t in c["layer_types"]]
    dense = c["mlp_layer_types"].count("dense")
    assert c["mlp_layer_types"] == ["dense"] * dense + ["sparse"] * (layers - dense)
    w = gguf.GGUFWriter(out, ARCH)
    # TextModel.set_gguf_parameters, after KimiLinearModel set num_key_value_heads to 1
    w.add_block_count(layers)
    w.add_context_length(c["model_max_length"])
    w.add_embedding_length(c["hidden_size"])
    w.add_feed_forward_length(c["intermediate_size"])
    w.add_head_count(c["num_attention_heads"])
    w.add_head_count_kv(1)
    w.add_layer_norm_rms_eps(c["rms_norm_eps"])
    w.add_expert_count(c["num_experts"])
    w.add_expert_used_count(c["num_experts_per_token"])
    w.add_expert_group_used_count(c["topk_group"])  # (the release's num_expert_group is not n_group: no count)
    if gating is not None:
        w.add_expert_gating_func(gating)  # (from moe_router_activation_func "sigmoid")
    w.add_key_length(c["head_dim"])
    w.add_value_length(c["head_dim"])
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    # KimiLinearModel's own
    w.add_vocab_size(c["vocab_size"])
    w.add_head_count_kv([1 if f else 0 for f in full])  # (overwrites the base's)
    w.add_ssm_conv_kernel(c["linear_conv_kernel_dim"])
    w.add_kda_head_dim(c["linear_head_dim"])
    if c.get("q_lora_rank") is not None:
        w.add_q_lora_rank(c["q_lora_rank"])
    w.add_kv_lora_rank(c["kv_lora_rank"])
    w.add_rope_dimension_count(c["qk_rope_head_dim"])
    w.add_key_length(c["kv_lora_rank"] + c["qk_rope_head_dim"])  # (overwrites the base's)
    w.add_key_length_mla(c["qk_nope_head_dim"] + c["qk_rope_head_dim"])
    w.add_value_length_mla(c["v_head_dim"])
    w.add_expert_feed_forward_length(c["moe_intermediate_size"])
    w.add_expert_shared_count(c["num_shared_experts"])
    w.add_leading_dense_block_count(dense)
    if scale:
        w.add_expert_weights_scale(c["routed_scaling_factor"])
    add_padded_vocab(w, c["vocab_size"], "kimi-k2", bos=c["bos_token_id"], eos=c["eos_token_id"])
    maps = [gguf.get_tensor_name_map(MODEL_ARCH.KIMI_LINEAR, layers)]
    experts: dict = {}
    for name, t in load_all(src).items():
        layer = int(name.split(".")[2]) if name.startswith("model.layers.") else None
        if layer is not None and layer < dense:  # the release's dense MLP is mlp.*
            name = name.replace(".block_sparse_moe.", ".mlp.")
        if ".block_sparse_moe.experts." in name:
            collect_expert(experts, name, t)
            continue
        if name.endswith(("q_conv1d.weight", "k_conv1d.weight", "v_conv1d.weight")):
            d_inner, _, d_conv = t.shape
            t = t.reshape(1, d_inner, 1, d_conv)
        if name.endswith(".A_log"):
            t = -torch.exp(t)
        if name.endswith(".dt_bias"):
            name = name.replace(".dt_bias", ".dt_proj.bias")
        name = name.replace("e_score_correction_bias", "e_score_correction.bias")  # (ModelBase.filter_tensors)
        if name.endswith("kv_b_proj.weight"):
            heads, nope, v_dim = c["num_key_value_heads"], c["qk_nope_head_dim"], c["v_head_dim"]
            kv_b = t.view(heads, v_dim + nope, t.shape[-1])
            k_b, v_b = torch.split(kv_b, [nope, v_dim], dim=1)
            for half, data in (("k_b_proj", k_b.transpose(1, 2)), ("v_b_proj", v_b)):
                gname = _gguf_name(maps, name.replace("kv_b_proj", half))
                if gname != drop:
                    w.add_tensor(gname, data.contiguous().numpy())
            continue
        if _gguf_name(maps, name) != drop:
            w.add_tensor(_gguf_name(maps, name), t.contiguous().numpy())
    for (_, merged), by_expert in sorted(experts.items()):
        stacked = torch.stack([by_expert[e] for e in range(len(by_expert))])
        w.add_tensor(_gguf_name(maps, merged), stacked.contiguous().numpy())
    return write_gguf(w, out)


@pytest.fixture(autouse=True)
def as_released(monkeypatch) -> None:
    """One expert group, as the release has it (num_expert_group 1): the converter writes no group count."""
    configs = checkpoints.FAMILY_CONFIGS
    monkeypatch.setitem(configs, "kimi_linear", {**configs["kimi_linear"], "n_group": 1, "topk_group": 1})


def test_kimi_linear_gguf_generates_what_transformers_does(tmp_path: Path) -> None:
    """tests/checkpoints.py's kimi_linear: KDA layers 0, 2 and 3, a NoPE MLA layer 1 with the low-rank query,
    a dense first layer, eight experts keeping two and a shared one, the correction bias random; logits to
    1e-4 and 32 greedy tokens, decoded with the cache (tests/parity.py)."""
    src = save_checkpoint("kimi_linear", tmp_path / "hf", seed=1)
    ours = convert_and_load(export_kimi_linear_gguf(src, tmp_path / "model.gguf"), tmp_path / "store")
    assert_parity(ours, hf_model(src), PROMPT, STEPS)


def test_kimi_linear_gguf_config_and_tensors_are_the_checkpoints(tmp_path: Path) -> None:
    """The source config is the checkpoint's (layer types from head_count_kv, the MLA sizes, the MoE keys),
    the FTW config the HF path's; every tensor is the checkpoint's bit for bit but A_log (log(exp(A_log)) in
    float32, to a rounding), the convs and kv_b rebuilt exactly; the expert banks are the same bytes."""
    src = save_checkpoint("kimi_linear", tmp_path / "hf")
    direct = convert_checkpoint(src, tmp_path / "ftw-hf")
    index = convert_gguf(export_kimi_linear_gguf(src, tmp_path / "model.gguf"), tmp_path / "ftw")
    assert index.family == direct.family == "kimi_linear"
    hf_config = json.loads((src / "config.json").read_text())
    assert config_differences(index.source_config, hf_config) == {}
    assert index.config == direct.config
    assert {t.name for t in index.tensors} == {t.name for t in direct.tensors}
    ours, theirs = FTWReader.open(tmp_path / "ftw"), FTWReader.open(tmp_path / "ftw-hf")
    assert [b.layer for b in index.banks] == [b.layer for b in direct.banks] == [1, 2, 3]
    for b in direct.banks:
        assert torch.equal(ours.bank_bytes(b.layer), theirs.bank_bytes(b.layer))
    for t in direct.tensors:
        a, b = ours.tensor(t.name), theirs.tensor(t.name)
        if t.name.endswith("A_log"):
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)
        else:
            assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b), t.name


def test_kimi_linear_gguf_without_the_low_rank_query(tmp_path: Path, monkeypatch) -> None:
    """q_lora_rank null: the MLA layer's attn_q, no q_lora_rank key; runs as transformers does."""
    configs = checkpoints.FAMILY_CONFIGS
    monkeypatch.setitem(configs, "kimi_linear", {**configs["kimi_linear"], "q_lora_rank": None})
    src = save_checkpoint("kimi_linear", tmp_path / "hf", seed=2)
    path = export_kimi_linear_gguf(src, tmp_path / "model.gguf")
    assert "blk.1.attn_q.weight" in {t.name for t in gguf.GGUFReader(path).tensors}
    ours = convert_and_load(path, tmp_path / "store")
    assert ours.config.source.get("q_lora_rank") is None
    assert_parity(ours, hf_model(src), PROMPT, STEPS)


def test_kimi_linear_gguf_refusals(tmp_path: Path) -> None:
    """Softmax routing or none said (transformers' Kimi Linear routes by sigmoid; llama.cpp requires the key),
    no expert_weights_scale (llama.cpp would scale by 0), an MLA layer with half its kv_b."""
    src = save_checkpoint("kimi_linear", tmp_path / "hf")
    softmax = export_kimi_linear_gguf(src, tmp_path / "softmax.gguf", gating=gguf.ExpertGatingFuncType.SOFTMAX)
    with pytest.raises(UnsupportedArchitectureError, match="expert_gating_func 1"):
        convert_gguf(softmax, tmp_path / "a")
    with pytest.raises(UnsupportedArchitectureError, match="expert_gating_func None"):
        convert_gguf(export_kimi_linear_gguf(src, tmp_path / "none.gguf", gating=None), tmp_path / "b")
    with pytest.raises(SourceError, match="without expert_weights_scale"):
        convert_gguf(export_kimi_linear_gguf(src, tmp_path / "scale.gguf", scale=False), tmp_path / "c")
    with pytest.raises(SourceError, match=r"layer 1 has \['v_b'\] of attn_k_b/attn_v_b, needs both"):
        convert_gguf(export_kimi_linear_gguf(src, tmp_path / "drop.gguf", drop="blk.1.attn_k_b.weight"), tmp_path / "d")


def test_kimi_linear_gguf_missing_a_kda_tensor_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    """The converter's shape checks know the tensors every family shares; a KDA layer's own (its beta
    projection here) only the kimi_linear runtime names: `ft pull` passes its build over shape-only
    tensors (runtime/loading/family_tensors.py) as the converter's family check, which refuses the file by
    the tensor's name before a byte is written."""
    src = save_checkpoint("kimi_linear", tmp_path / "hf")
    path = export_kimi_linear_gguf(src, tmp_path / "nobeta.gguf", drop="blk.0.ssm_beta.weight")
    with pytest.raises(SourceError, match=r"no tensor 'model\.layers\.0\.self_attn\.b_proj\.weight', which the "
                                          "kimi_linear runtime reads"):
        convert_gguf(path, tmp_path / "ftw", family_check=check_family_tensors)
    assert not (tmp_path / "ftw").exists() or not any((tmp_path / "ftw").iterdir())
