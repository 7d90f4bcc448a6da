"""Tencent Hy3 (hy_v3) as a GGUF file (`hy_v3`), written the way llama.cpp's converter writes it
(conversion/hunyuan.py, HYV3Model over TextModel, at llama.cpp 0c1e570), pulled through ft and run against
transformers.

`export_hy_v3_gguf` follows that converter: the base keys (key_length from head_dim, feed_forward_length the
dense layer's width), expert_feed_forward_length, expert_shared_feed_forward_length (num_shared_experts x
moe_intermediate_size), expert_weights_norm (route_norm, True where the config has none) and _scale
(router_scaling_factor), expert_gating_func sigmoid, nextn_predict_layers with an MTP block; the experts
stacked; the release's names as gguf-py maps them (mlp.router.gate to ffn_gate_inp, mlp.shared_mlp to the
shexp tensors, mlp.expert_bias to exp_probs_b without a suffix, as hy-v3.cpp loads it). gguf 0.19 has no
hy_v3 architecture: its tables of hunyuan-moe (ffn_norm, the shared MLP) and then afmoe (the router, the bias)
give them. llama.cpp 0c1e570
lists no pre-tokenizer for Hy3's vocabulary; the test's is Hunyuan's.
"""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import pytest
import torch
from gguf.constants import MODEL_ARCH

from ftw import convert_checkpoint
from ftw.gguf_convert import convert_gguf
from tests.checkpoints import load_all, save_checkpoint
from tests.gguf_export import add_base_keys, add_padded_vocab, config_differences
from tests.parity import assert_parity, convert_and_load
from tests.test_ftw_convert import assert_round_trip
from tests.test_ftw_gguf_hf import _gguf_name, add_stacked_experts, collect_expert, write_gguf
from tests.test_parity import PROMPT, STEPS, hf_model

pytest.importorskip("transformers")


def export_hy_v3_gguf(src: Path, out: Path, *, mtp: bool = False, route_norm: bool = True) -> Path:
    """The file HYV3Model writes from `src`; `mtp`, an MTP block after the last layer (block_count one more,
    nextn_predict_layers 1); `route_norm`, the config's route_norm."""
    c = json.loads((src / "config.json").read_text())
    layers = c["num_hidden_layers"]
    w = gguf.GGUFWriter(out, "hy_v3")
    add_base_keys(w, c, block_count=layers + mtp)
    w.add_expert_feed_forward_length(c["moe_intermediate_size"])  # (HYV3Model's)
    w.add_expert_shared_feed_forward_length(c["moe_intermediate_size"] * c["num_shared_experts"])
    w.add_expert_weights_norm(route_norm)
    w.add_expert_weights_scale(float(c["router_scaling_factor"]))
    w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
    if mtp:
        w.add_nextn_predict_layers(1)
    add_padded_vocab(w, c["vocab_size"], "hunyuan", bos=c.get("bos_token_id"), eos=c.get("eos_token_id"))
    maps = [gguf.get_tensor_name_map(a, layers + mtp) for a in (MODEL_ARCH.HUNYUAN_MOE, MODEL_ARCH.AFMOE)]
    tensors = load_all(src)
    if mtp:  # an MTP block: layer 1's tensors under the next index
        tensors |= {n.replace("layers.1.", f"layers.{layers}."): t for n, t in tensors.items() if ".layers.1." in n}
        tensors[f"model.layers.{layers}.eh_proj.weight"] = torch.zeros(c["hidden_size"], 2 * c["hidden_size"])
    experts: dict = {}
    for name, t in tensors.items():
        if ".mlp.experts." in name:
            collect_expert(experts, name, t.float())
            continue
        if name.endswith("eh_proj.weight"):
            w.add_tensor(f"blk.{layers}.nextn.eh_proj.weight", t.contiguous().numpy())
            continue
        gname = _gguf_name(maps, name)  # (expert_bias, suffix-less, maps to exp_probs_b alone)
        w.add_tensor(gname, t.float().contiguous().numpy())
    add_stacked_experts(w, maps, experts)
    return write_gguf(w, out)


@pytest.mark.parametrize("mtp", [False, True], ids=["plain", "nextn"])
def test_hy_v3_gguf_generates_what_transformers_does(tmp_path: Path, mtp: bool) -> None:
    src = save_checkpoint("hy_v3", tmp_path / "hf", seed=1)
    ours = convert_and_load(export_hy_v3_gguf(src, tmp_path / "model.gguf", mtp=mtp), tmp_path / "store")
    assert_parity(ours, hf_model(src), PROMPT, STEPS)


def test_hy_v3_gguf_config_is_the_checkpoints(tmp_path: Path) -> None:
    """The FTW config and tensors from the GGUF are the HF path's (the dense first layer, the bias, the shared
    MLP two experts wide, the scale), the source config the checkpoint's; every tensor back bit for bit."""
    src = save_checkpoint("hy_v3", tmp_path / "hf")
    direct = convert_checkpoint(src, tmp_path / "ftw-hf")
    index = convert_gguf(export_hy_v3_gguf(src, tmp_path / "model.gguf", mtp=True), tmp_path / "ftw")
    assert index.family == direct.family == "hy_v3"
    assert index.config == direct.config
    assert config_differences(index.source_config, json.loads((src / "config.json").read_text())) == {}
    assert {t.name for t in index.tensors} == {t.name for t in direct.tensors}
    assert_round_trip(src, tmp_path / "ftw")


def test_hy_v3_gguf_without_renormalization_is_read_so(tmp_path: Path) -> None:
    """route_norm false: llama.cpp does not renormalize the top-k weights, and ft's config says so."""
    src = save_checkpoint("hy_v3", tmp_path / "hf")
    index = convert_gguf(export_hy_v3_gguf(src, tmp_path / "model.gguf", route_norm=False), tmp_path / "ftw")
    assert index.source_config["norm_topk_prob"] is False
