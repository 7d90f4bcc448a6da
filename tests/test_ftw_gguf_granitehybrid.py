"""Granite 4.0 hybrid (granitemoehybrid) as a GGUF file (`granitehybrid`), written the way llama.cpp's
converter writes it (conversion/granite.py, GraniteHybridModel over Mamba2Model and GraniteMoeModel,
at llama.cpp 0c1e570), pulled through ft and run against transformers.

`export_granitehybrid_gguf` follows that converter: GraniteMoeModel's keys (the base's with
head_count_kv one a layer, 0 on the Mamba2 layers; Granite's four multipliers; the shared MLP's
width), the ssm keys (conv_kernel, state_size, group_count, inner_size = mamba_expand x hidden,
time_step_rank = mamba_n_heads), rope.scaling.finetuned false and context_length 2^20 (every
GraniteMoeHybrid: the converter's use_rope is true only for Bamba); on the Mamba2 layers the conv
squeezed to [C, K], A_log as -exp(A_log) and D both [heads, 1], the norm [G, I / G], dt_bias as
ssm_dt.bias; on the attention layers q/k permuted (undo_permute); Granite's fused input_linear split
into ffn_gate_exps/ffn_up_exps and the shared MLP's into ffn_gate_shexp/ffn_up_shexp; the vocabulary
padded with [PAD] tokens.

The converter picks the attention layers by the releases' name "attention" in layer_types; the tiny
checkpoint, saved by transformers 5, says "full_attention" for them, read here as the same.
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
from tests.checkpoints import load_all, save_checkpoint
from tests.gguf_export import add_base_keys, add_padded_vocab, config_differences
from tests.parity import assert_parity, convert_and_load
from tests.test_ftw_gguf_hf import _gguf_name, llama_cpp_permute, write_gguf
from tests.test_parity import PROMPT, STEPS, hf_model

pytest.importorskip("transformers")


def export_granitehybrid_gguf(src: Path, out: Path, *, rope_key: bool = True, dense: bool = False) -> Path:
    """`src` as GraniteHybridModel writes it; without `rope_key`, no rope.scaling.finetuned (llama.cpp
    then rotates); `dense`: as a checkpoint without experts is written (Granite 4.0-H-Micro's
    num_local_experts 0: expert_count 0, the shared MLP as the layer's ffn_gate/ffn_up/ffn_down)."""
    c = json.loads((src / "config.json").read_text())
    layers, hidden = c["num_hidden_layers"], c["hidden_size"]
    attention = [t in ("attention", "full_attention") for t in c["layer_types"]]
    w = gguf.GGUFWriter(out, "granitehybrid")
    kv = [c["num_key_value_heads"] if a else 0 for a in attention]
    add_base_keys(w, {**c, "num_key_value_heads": kv, "max_position_embeddings": 2**20})
    w.add_vocab_size(c["vocab_size"])  # (LlamaModel's)
    w.add_rope_dimension_count(hidden // c["num_attention_heads"])
    w.add_attention_scale(c["attention_multiplier"])  # (GraniteModel's)
    w.add_embedding_scale(c["embedding_multiplier"])
    w.add_residual_scale(c["residual_multiplier"])
    w.add_logit_scale(c["logits_scaling"])
    if dense:
        w.add_expert_count(0)
    else:
        w.add_expert_shared_feed_forward_length(c["shared_intermediate_size"])  # (GraniteMoeModel's)
    w.add_ssm_conv_kernel(c["mamba_d_conv"])  # (GraniteHybridModel's)
    w.add_ssm_state_size(c["mamba_d_state"])
    w.add_ssm_group_count(c["mamba_n_groups"])
    w.add_ssm_inner_size(c["mamba_expand"] * hidden)
    w.add_ssm_time_step_rank(c["mamba_n_heads"])
    if rope_key:
        w.add_rope_scaling_finetuned(False)
    add_padded_vocab(w, c["vocab_size"], "gpt-2", bos=c["bos_token_id"], eos=c["eos_token_id"])
    maps = [gguf.get_tensor_name_map(MODEL_ARCH.GRANITE_HYBRID, layers)]
    groups, inner = c["mamba_n_groups"], c["mamba_expand"] * hidden
    for name, t in load_all(src).items():
        t, parts = t.float(), name.split(".")
        if dense and "block_sparse_moe" in name:
            continue
        if dense and "shared_mlp" in name:  # GraniteMoeModel.modify_tensors without experts
            names = ("ffn_gate", "ffn_up") if "input_linear" in name else ("ffn_down",)
            for part, half in zip(names, t.split(c["shared_intermediate_size"], dim=-2) if len(names) == 2 else (t,),
                                  strict=True):
                w.add_tensor(f"blk.{parts[2]}.{part}.weight", half.contiguous().numpy())
            continue
        if name.endswith("input_linear.weight"):  # GraniteMoeModel.modify_tensors: gate rows, then up
            shared = "shared_mlp" in name
            halves = t.split(c["shared_intermediate_size" if shared else "intermediate_size"], dim=-2)
            kinds = ((MODEL_TENSOR.FFN_GATE_SHEXP, MODEL_TENSOR.FFN_UP_SHEXP) if shared else
                     (MODEL_TENSOR.FFN_GATE_EXP, MODEL_TENSOR.FFN_UP_EXP))
            for kind, half in zip(kinds, halves, strict=True):
                w.add_tensor(TENSOR_NAMES[kind].format(bid=parts[2]) + ".weight", half.contiguous().numpy())
            continue
        if name.endswith(("q_proj.weight", "k_proj.weight")):  # LlamaModel.modify_tensors (undo_permute)
            t = llama_cpp_permute(t, c["num_attention_heads"], c["num_key_value_heads"] if "k_proj" in name else None)
        if ".mamba." in name:  # Mamba2Model.filter_tensors / modify_tensors
            name = name.replace(".dt_bias", ".dt_proj.bias")
            if name.endswith("conv1d.weight"):
                t = t.squeeze()
            elif name.endswith((".A_log", ".D")):
                t = t.reshape((*t.shape, 1))
            elif name.endswith("norm.weight"):
                t = t.reshape((groups, inner // groups))
            if name.endswith(".A_log"):
                t = -torch.exp(t)
        w.add_tensor(_gguf_name(maps, name), t.contiguous().numpy())
    return write_gguf(w, out)


def _checkpoint(out: Path, seed: int, **changes) -> Path:
    """The tiny hybrid of tests/checkpoints.py with config changes that move no weight."""
    src = save_checkpoint("granitemoehybrid", out, seed=seed)
    config = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**config, **changes}))
    return src


def test_granitehybrid_gguf_generates_what_transformers_does(tmp_path: Path) -> None:
    """NoPE attention (what the converter writes) and Mamba2 chunks of GraniteMoeHybridConfig's 256,
    which the file does not carry."""
    src = _checkpoint(tmp_path / "hf", seed=1, mamba_chunk_size=256)
    ours = convert_and_load(export_granitehybrid_gguf(src, tmp_path / "model.gguf"), tmp_path / "store")
    assert_parity(ours, hf_model(src), PROMPT, STEPS)


def test_a_file_without_the_rope_switch_rotates(tmp_path: Path) -> None:
    """No rope.scaling.finetuned: llama.cpp's default, true, rotates queries and keys."""
    src = _checkpoint(tmp_path / "hf", seed=2, mamba_chunk_size=256, position_embedding_type="rope")
    gguf_path = export_granitehybrid_gguf(src, tmp_path / "model.gguf", rope_key=False)
    assert_parity(convert_and_load(gguf_path, tmp_path / "store"), hf_model(src), PROMPT, STEPS)


def test_granitehybrid_gguf_config_and_tensors_are_the_checkpoints(tmp_path: Path) -> None:
    """The FTW config from the GGUF is the HF checkpoint's but for what the file does not say (the
    chunk size, the context length the converter sets to 2^20); every tensor is the checkpoint's bit
    for bit, A_log (log(exp(A_log)) in float32) to a rounding."""
    src = save_checkpoint("granitemoehybrid", tmp_path / "hf")
    direct = convert_checkpoint(src, tmp_path / "ftw-hf")
    index = convert_gguf(export_granitehybrid_gguf(src, tmp_path / "model.gguf"), tmp_path / "ftw")
    hf_config = json.loads((src / "config.json").read_text())
    assert config_differences(index.source_config, hf_config) == {
        "mamba_chunk_size": (256, 8), "max_position_embeddings": (2**20, 2048),
        "layer_types": (["mamba", "attention", "mamba", "mamba"], hf_config["layer_types"])}
    assert config_differences(index.config, direct.config) == {"context_length": (2**20, 2048)}
    assert {t.name for t in index.tensors} == {t.name for t in direct.tensors}
    ours, theirs = FTWReader.open(tmp_path / "ftw"), FTWReader.open(tmp_path / "ftw-hf")
    assert [b.layer for b in index.banks] == [b.layer for b in direct.banks] == [0, 1, 2, 3]
    for b in direct.banks:  # the experts, their gate and up halves joined back
        assert torch.equal(ours.bank_bytes(b.layer), theirs.bank_bytes(b.layer))
    for t in direct.tensors:
        a, b = ours.tensor(t.name), theirs.tensor(t.name)
        if t.name.endswith("A_log"):
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)
        else:
            assert a.dtype == b.dtype and torch.equal(a, b), t.name


def test_a_hybrid_without_experts_is_refused(tmp_path: Path) -> None:
    """A dense hybrid (no routed experts): ft's granitemoehybrid always builds the MoE."""
    src = save_checkpoint("granitemoehybrid", tmp_path / "hf")
    gguf_path = export_granitehybrid_gguf(src, tmp_path / "model.gguf", dense=True)
    with pytest.raises(UnsupportedArchitectureError, match="without routed experts"):
        convert_gguf(gguf_path, tmp_path / "ftw")
