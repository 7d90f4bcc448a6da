"""NVIDIA Nemotron-H MoE (nemotron_h) as a GGUF file (`nemotron_h_moe`), written the way llama.cpp's
converter writes it (conversion/nemotron.py, NemotronHModel over GraniteHybridModel, at llama.cpp
0c1e570), pulled through ft and run against transformers.

`export_nemotron_h_gguf` follows that converter: the base keys (head_count_kv one a layer, 0 but on
the attention layers; feed_forward_length one a layer, the experts' width on the MoE layers, else
0; key_length head_dim; attention.layer_norm_epsilon), the ssm keys (conv_kernel, state_size,
group_count, inner_size = mamba_num_heads x mamba_head_dim, time_step_rank = mamba_num_heads),
rope.scaling.finetuned false and context_length 2^20, the MoE keys (expert_group_count but no
expert_group_used_count); on the Mamba2 layers Mamba2Model's changes (the conv squeezed, A_log as
-exp(A_log) and D both [heads, 1], the norm [G, I / G], dt_bias as ssm_dt.bias); q/k permuted
(GraniteHybridModel's undo_permute); the experts' up_proj and down_proj stacked (no gate); the
vocabulary padded with [PAD] tokens.

The tiny checkpoint is tests/checkpoints.py's without the dense MLP layer (pattern ME*EME) and with
one expert group, as the release (Nemotron 3 Nano) has them: llama.cpp cannot load either otherwise.
"""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import pytest
import torch
from gguf.constants import MODEL_ARCH, MODEL_TENSOR, TENSOR_NAMES

from ftw import FTWReader, convert_checkpoint
from ftw.errors import UnsupportedArchitectureError
from ftw.gguf_convert import convert_gguf
from tests import checkpoints
from tests.checkpoints import load_all, save_checkpoint
from tests.gguf_export import add_base_keys, add_padded_vocab, config_differences
from tests.parity import assert_parity, convert_and_load
from tests.test_ftw_gguf_hf import _gguf_name, llama_cpp_permute, write_gguf
from tests.test_parity import PROMPT, STEPS, hf_model

pytest.importorskip("transformers")

RELEASE_LIKE = dict(hybrid_override_pattern="ME*EME", n_group=1, topk_group=1, chunk_size=128)


def export_nemotron_h_gguf(src: Path, out: Path, *, group_used_count: bool = False) -> Path:
    """`src` (the release's backbone. names, per-expert) as NemotronHModel writes it; with
    `group_used_count`, also expert_group_used_count (topk_group), which the converter leaves out."""
    c = json.loads((src / "config.json").read_text())
    kinds, hidden = c["layers_block_type"], c["hidden_size"]
    layers, heads, kv_heads = len(kinds), c["num_attention_heads"], c["num_key_value_heads"]
    w = gguf.GGUFWriter(out, "nemotron_h_moe")
    add_base_keys(w, {**c, "num_hidden_layers": layers, "max_position_embeddings": 2**20, "n_group": None,
                      "num_key_value_heads": [kv_heads if k == "full_attention" else 0 for k in kinds],
                      "intermediate_size": [c["moe_intermediate_size"] if k == "moe" else 0 for k in kinds]})
    w.add_layer_norm_eps(c["layer_norm_epsilon"])  # (the base's, from layer_norm_epsilon)
    w.add_vocab_size(c["vocab_size"])  # (LlamaModel's)
    w.add_rope_dimension_count(hidden // heads)
    w.add_ssm_conv_kernel(c["conv_kernel"])  # (GraniteHybridModel's)
    w.add_ssm_state_size(c["ssm_state_size"])
    w.add_ssm_group_count(c["n_groups"])
    w.add_ssm_inner_size(c["mamba_num_heads"] * c["mamba_head_dim"])
    w.add_ssm_time_step_rank(c["mamba_num_heads"])
    w.add_rope_scaling_finetuned(False)
    w.add_expert_feed_forward_length(c["moe_intermediate_size"])  # (NemotronHModel's)
    w.add_expert_shared_feed_forward_length(c["moe_shared_expert_intermediate_size"])
    w.add_expert_shared_count(c["n_shared_experts"])
    w.add_expert_weights_norm(c["norm_topk_prob"])
    w.add_expert_weights_scale(c["routed_scaling_factor"])
    w.add_expert_group_count(c["n_group"])
    if group_used_count:
        w.add_expert_group_used_count(c["topk_group"])
    add_padded_vocab(w, c["vocab_size"], "gpt-2", bos=c["bos_token_id"], eos=c["eos_token_id"])
    maps = [gguf.get_tensor_name_map(MODEL_ARCH.NEMOTRON_H_MOE, layers)]
    groups, inner = c["n_groups"], c["mamba_num_heads"] * c["mamba_head_dim"]
    experts: dict[tuple[int, str], dict[int, torch.Tensor]] = {}
    for name, t in load_all(src).items():
        t, parts = t.float(), name.split(".")
        if ".mixer.experts." in name:  # NemotronHModel.modify_tensors: stacked, up and down alone
            experts.setdefault((int(parts[2]), parts[6]), {})[int(parts[5])] = t
            continue
        name = name.replace("e_score_correction_bias", "e_score_correction.bias").replace(".dt_bias", ".dt_proj.bias")
        if name.endswith(("q_proj.weight", "k_proj.weight")):  # LlamaModel.modify_tensors (undo_permute)
            t = llama_cpp_permute(t, heads, kv_heads if "k_proj" in name else None)
        elif name.endswith("conv1d.weight"):  # Mamba2Model.modify_tensors
            t = t.squeeze()
        elif name.endswith((".A_log", ".D")):
            t = t.reshape((*t.shape, 1))
        elif name.endswith("mixer.norm.weight"):  # (only the Mamba2 mixers have a norm)
            t = t.reshape((groups, inner // groups))
        if name.endswith(".A_log"):
            t = -torch.exp(t)
        w.add_tensor(_gguf_name(maps, name), t.contiguous().numpy())
    for (layer, proj), by_expert in sorted(experts.items()):
        kind = MODEL_TENSOR.FFN_UP_EXP if proj == "up_proj" else MODEL_TENSOR.FFN_DOWN_EXP
        stacked = torch.stack([by_expert[e] for e in sorted(by_expert)])
        w.add_tensor(TENSOR_NAMES[kind].format(bid=layer) + ".weight", stacked.contiguous().numpy())
    return write_gguf(w, out)


def _checkpoint(out: Path, seed: int, monkeypatch: pytest.MonkeyPatch, **changes) -> Path:
    monkeypatch.setitem(checkpoints.FAMILY_CONFIGS, "nemotron_h", {**checkpoints.FAMILY_CONFIGS["nemotron_h"], **changes})
    return save_checkpoint("nemotron_h", out, seed=seed)


def test_nemotron_h_gguf_generates_what_transformers_does(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src = _checkpoint(tmp_path / "hf", 1, monkeypatch, **RELEASE_LIKE)
    ours = convert_and_load(export_nemotron_h_gguf(src, tmp_path / "model.gguf"), tmp_path / "store")
    bank = ours.weights.banks[1].layout
    assert sorted(ours.weights.banks) == [1, 3, 5]
    assert bank.activation.kind == "relu2" and bank.part("w13").shape == (32, 64)  # the up rows alone
    assert_parity(ours, hf_model(src), PROMPT, STEPS)


def test_expert_groups_with_the_used_count_match_transformers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two groups keeping one: a file with expert_group_used_count (which llama.cpp needs to load it)."""
    src = _checkpoint(tmp_path / "hf", 2, monkeypatch, **{**RELEASE_LIKE, "n_group": 2, "topk_group": 1})
    gguf_path = export_nemotron_h_gguf(src, tmp_path / "model.gguf", group_used_count=True)
    assert_parity(convert_and_load(gguf_path, tmp_path / "store"), hf_model(src), PROMPT, STEPS)


def test_groups_without_the_used_count_are_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src = _checkpoint(tmp_path / "hf", 3, monkeypatch, **{**RELEASE_LIKE, "n_group": 2, "topk_group": 1})
    with pytest.raises(UnsupportedArchitectureError, match="no expert_group_used_count"):
        convert_gguf(export_nemotron_h_gguf(src, tmp_path / "model.gguf"), tmp_path / "ftw")


def test_a_dense_mlp_layer_is_refused(tmp_path: Path) -> None:
    """The parity test's checkpoint (ME*E-ME): its - layer is written as a Mamba2 layer would be."""
    src = save_checkpoint("nemotron_h", tmp_path / "hf", seed=4)
    config = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**config, "n_group": 1, "topk_group": 1}))
    with pytest.raises(UnsupportedArchitectureError, match="dense MLP layers"):
        convert_gguf(export_nemotron_h_gguf(src, tmp_path / "model.gguf"), tmp_path / "ftw")


def test_nemotron_h_gguf_config_and_tensors_are_the_checkpoints(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The FTW config from the GGUF is the HF checkpoint's but for the context length the converter
    sets to 2^20; every tensor and expert bank is the checkpoint's bit for bit, A_log
    (log(exp(A_log)) in float32) to a rounding."""
    src = _checkpoint(tmp_path / "hf", 5, monkeypatch, **RELEASE_LIKE)
    direct = convert_checkpoint(src, tmp_path / "ftw-hf")
    index = convert_gguf(export_nemotron_h_gguf(src, tmp_path / "model.gguf"), tmp_path / "ftw")
    hf_config = json.loads((src / "config.json").read_text())
    assert config_differences(index.source_config, hf_config) == {"max_position_embeddings": (2**20, 4096)}
    assert config_differences(index.config, direct.config) == {"context_length": (2**20, 4096)}
    assert {t.name for t in index.tensors} == {t.name for t in direct.tensors}
    ours, theirs = FTWReader.open(tmp_path / "ftw"), FTWReader.open(tmp_path / "ftw-hf")
    assert [b.layer for b in index.banks] == [b.layer for b in direct.banks] == [1, 3, 5]
    for b in direct.banks:
        assert torch.equal(ours.bank_bytes(b.layer), theirs.bank_bytes(b.layer))
    for t in direct.tensors:
        a, b = ours.tensor(t.name), theirs.tensor(t.name)
        if t.name.endswith("A_log"):
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)
        else:
            assert a.dtype == b.dtype and torch.equal(a, b), t.name
