"""Cohere's North / Command A MoE (cohere2_moe) as a GGUF file (`cohere2moe`), written the way llama.cpp's
converter writes it (conversion/command_r.py, Cohere2MoeModel over TextModel, at llama.cpp 0c1e570), pulled
through ft and run against transformers.

`export_cohere2moe_gguf` follows that converter: the base keys (find_hparam's: feed_forward_length from
prefix_dense_intermediate_size, none where that key is null; layer_norm_epsilon, and layer_norm_rms_epsilon
only where rms_norm_eps is not null; expert_gating_func from expert_selection_fn; key_length from head_dim),
then logit_scale, attention.sliding_window, sliding_window_pattern (one bool a layer from layer_types),
vocab_size, expert_feed_forward_length (intermediate_size), leading_dense_block_count (the dense lead of
mlp_layer_types), expert_weights_norm (norm_topk_prob), expert_shared_count and
expert_shared_feed_forward_length, nextn_predict_layers with an MTP block, rope.dimension_count head_dim,
rope scaling none; the experts stacked, nothing permuted (llama.cpp's cohere2moe rotates interleaved pairs,
LLAMA_ROPE_TYPE_NORM, as transformers does). gguf 0.19 has no cohere2moe architecture: its qwen3moe table and
then deepseek2's (the dense MLP, the shared experts) give the names llama-arch.cpp's tensors have.
"""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import pytest
import torch
from gguf.constants import MODEL_ARCH

from ftw import convert_checkpoint
from ftw.errors import SourceError, UnsupportedArchitectureError
from ftw.gguf_convert import convert_gguf
from tests.checkpoints import FAMILY_CONFIGS, load_all, save_checkpoint
from tests.gguf_export import add_padded_vocab, config_differences
from tests.parity import assert_parity, convert_and_load
from tests.test_ftw_convert import assert_round_trip
from tests.test_ftw_gguf_hf import _gguf_name, add_stacked_experts, collect_expert, write_gguf
from tests.test_parity import PROMPT, STEPS, hf_model

pytest.importorskip("transformers")

GATING = {"softmax": gguf.ExpertGatingFuncType.SOFTMAX, "sigmoid": gguf.ExpertGatingFuncType.SIGMOID}


def save_cohere2_moe(out: Path, monkeypatch: pytest.MonkeyPatch, **overrides) -> Path:
    """The parity test's cohere2_moe checkpoint (a dense rotating lead layer, sliding layers within 5 tokens
    and a NoPE full one, LayerNorms, two shared experts averaged) with `overrides`."""
    monkeypatch.setitem(FAMILY_CONFIGS, "cohere2_moe", {**FAMILY_CONFIGS["cohere2_moe"], **overrides})
    return save_checkpoint("cohere2_moe", out, seed=1)


def export_cohere2moe_gguf(src: Path, out: Path, *, mtp: bool = False, keys: dict | None = None) -> Path:
    """The file Cohere2MoeModel writes from `src`; `mtp`, an MTP block after the last layer (block_count one
    more, nextn_predict_layers 1); `keys`, further uint32 keys (or in place of rope.dimension_count)."""
    c = json.loads((src / "config.json").read_text())
    layers = c["num_hidden_layers"]
    w = gguf.GGUFWriter(out, "cohere2moe")
    w.add_block_count(layers + mtp)  # (the base's keys, as find_hparam finds them)
    w.add_context_length(c["max_position_embeddings"])
    w.add_embedding_length(c["hidden_size"])
    if (n_ff := c["prefix_dense_intermediate_size"] if "prefix_dense_intermediate_size" in c else c["intermediate_size"]):
        w.add_feed_forward_length(n_ff)
    w.add_head_count(c["num_attention_heads"])
    w.add_head_count_kv(c["num_key_value_heads"])
    w.add_rope_freq_base(c["rope_parameters"]["rope_theta"])
    if c.get("rms_norm_eps") is not None:
        w.add_layer_norm_rms_eps(c["rms_norm_eps"])
    w.add_layer_norm_eps(c["layer_norm_eps"])
    w.add_expert_count(c["num_experts"])
    w.add_expert_used_count(c["num_experts_per_tok"])
    w.add_expert_gating_func(GATING[c["expert_selection_fn"]])
    w.add_key_length(c["head_dim"])
    w.add_value_length(c["head_dim"])
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    dense_lead = next((i for i, t in enumerate(c["mlp_layer_types"]) if t != "dense"), layers)
    w.add_logit_scale(c["logit_scale"])  # (Cohere2MoeModel's)
    w.add_sliding_window(c["sliding_window"])
    w.add_sliding_window_pattern([t == "sliding_attention" for t in c["layer_types"]])
    w.add_vocab_size(c["vocab_size"])
    w.add_expert_feed_forward_length(c["intermediate_size"])
    w.add_leading_dense_block_count(dense_lead)
    w.add_expert_weights_norm(c["norm_topk_prob"])
    if c["num_shared_experts"] > 0:
        assert c["shared_expert_combination_strategy"] == "average", "the converter refuses the others"
        w.add_expert_shared_count(c["num_shared_experts"])
        w.add_expert_shared_feed_forward_length(c["intermediate_size"] * c["num_shared_experts"])
    if mtp:
        w.add_nextn_predict_layers(1)
    keys = keys or {}
    if "rope.dimension_count" not in keys:
        w.add_rope_dimension_count(c["head_dim"])
    w.add_rope_scaling_type(gguf.RopeScalingType.NONE)
    for key, value in keys.items():
        w.add_uint32(f"cohere2moe.{key}", value)
    add_padded_vocab(w, c["vocab_size"], "cohere2moe", bos=c.get("bos_token_id"), eos=c.get("eos_token_id"))
    maps = [gguf.get_tensor_name_map(a, layers + mtp) for a in (MODEL_ARCH.QWEN3MOE, MODEL_ARCH.DEEPSEEK2)]
    tensors = load_all(src)
    if mtp:  # an MTP block: layer 1's (MoE) tensors under the next index, with the NextN projection
        tensors |= {n.replace("layers.1.", f"layers.{layers}."): t for n, t in tensors.items() if ".layers.1." in n}
    experts: dict = {}
    for name, t in tensors.items():
        if name.endswith(".bias"):  # (the converter drops biases, refusing nonzero ones)
            assert not torch.any(t != 0)
            continue
        if ".mlp.experts." in name:
            collect_expert(experts, name, t.float())
            continue
        w.add_tensor(_gguf_name(maps, name), t.float().contiguous().numpy())
    if mtp:
        h = c["hidden_size"]
        w.add_tensor(f"blk.{layers}.nextn.eh_proj.weight", torch.zeros(h, 2 * h).numpy())
        w.add_tensor(f"blk.{layers}.nextn.enorm.weight", torch.ones(h).numpy())
        w.add_tensor(f"blk.{layers}.nextn.hnorm.weight", torch.ones(h).numpy())
    add_stacked_experts(w, maps, experts)
    return write_gguf(w, out)


@pytest.mark.parametrize("mtp", [False, True], ids=["plain", "nextn"])
def test_cohere2_moe_gguf_generates_what_transformers_does(tmp_path: Path, monkeypatch, mtp: bool) -> None:
    src = save_cohere2_moe(tmp_path / "hf", monkeypatch)
    ours = convert_and_load(export_cohere2moe_gguf(src, tmp_path / "model.gguf", mtp=mtp), tmp_path / "store")
    assert_parity(ours, hf_model(src), PROMPT, STEPS)


@pytest.mark.parametrize("normalize", [True, False], ids=["renormalized", "raw"])
def test_cohere2_moe_gguf_sigmoid_rms_generates_what_transformers_does(tmp_path: Path, monkeypatch,
                                                                       normalize: bool) -> None:
    """Sigmoid routing (renormalized or not, as expert_weights_norm says) and RMSNorms (layer_norm_rms_epsilon
    written): llama.cpp's other reading of the file, which transformers runs alike."""
    src = save_cohere2_moe(tmp_path / "hf", monkeypatch, expert_selection_fn="sigmoid", norm_topk_prob=normalize,
                           rms_norm_eps=1e-5)
    ours = convert_and_load(export_cohere2moe_gguf(src, tmp_path / "model.gguf"), tmp_path / "store")
    assert ours.config.get("expert_selection_fn") == "sigmoid"
    assert_parity(ours, hf_model(src), PROMPT, STEPS)


def test_cohere2_moe_gguf_config_is_the_checkpoints(tmp_path: Path, monkeypatch) -> None:
    """The FTW config and tensors from the GGUF are the HF path's (the dense lead, the layer kinds, the shared
    experts, the logit scale, the LayerNorms), the source config the checkpoint's; every tensor back bit for bit."""
    src = save_cohere2_moe(tmp_path / "hf", monkeypatch)
    direct = convert_checkpoint(src, tmp_path / "ftw-hf")
    index = convert_gguf(export_cohere2moe_gguf(src, tmp_path / "model.gguf", mtp=True), tmp_path / "ftw")
    assert index.family == direct.family == "cohere2_moe"
    assert index.config == direct.config
    assert config_differences(index.source_config, json.loads((src / "config.json").read_text())) == {}
    assert {t.name for t in index.tensors} == {t.name for t in direct.tensors}
    assert_round_trip(src, tmp_path / "ftw")


def test_cohere2_moe_gguf_refusals(tmp_path: Path, monkeypatch) -> None:
    """What llama.cpp runs and transformers' Cohere2Moe cannot, refused by name: softmax over all experts
    without renormalization, a routed-weight scale; and a rotation over part of each head (llama.cpp asserts
    the whole)."""
    src = save_cohere2_moe(tmp_path / "hf", monkeypatch, norm_topk_prob=False)
    with pytest.raises(UnsupportedArchitectureError, match="softmax routing without expert_weights_norm"):
        convert_gguf(export_cohere2moe_gguf(src, tmp_path / "raw.gguf"), tmp_path / "ftw-raw")
    src = save_cohere2_moe(tmp_path / "hf2", monkeypatch, norm_topk_prob=True)
    with pytest.raises(UnsupportedArchitectureError, match="expert_weights_scale"):
        convert_gguf(export_cohere2moe_gguf(src, tmp_path / "scaled.gguf", keys={"expert_weights_scale": 2}),
                     tmp_path / "ftw-scaled")
    with pytest.raises(SourceError, match="part of each head"):
        convert_gguf(export_cohere2moe_gguf(src, tmp_path / "half.gguf", keys={"rope.dimension_count": 8}),
                     tmp_path / "ftw-half")
