"""Xiaomi MiMo-V2-Flash (mimo_v2_flash) as a GGUF file (`mimo2`), written the way llama.cpp's converter writes
it (conversion/mimo.py at llama.cpp 0c1e570: MimoV2Model), pulled through ft and run against transformers.

The converter reads the release's config (hybrid_layer_pattern, swa_num_key_value_heads, rope_theta and
swa_rope_theta, partial_rotary_factor, layernorm_epsilon, scoring_func); `export_mimo2_gguf` writes what it
writes from the release config that the tiny transformers checkpoint stands for: the base keys (head_count_kv
then one a layer, the sliding layers' twice the full ones'; key_length head_dim; rope.freq_base from the full
layers' theta, rope.freq_base_swa from the sliding ones'; the group keys; expert_gating_func sigmoid),
MimoV2Model's (attention.sliding_window, sliding_window_pattern one int a layer, 1 sliding; value_length
v_head_dim; expert count and width; rope.dimension_count int(head_dim x partial_rotary_factor); the rms eps;
attention.value_scale), the experts stacked per layer, attention_sink_bias given ".weight" (attn_sinks), the
correction bias renamed; a byte-level vocabulary padded. Written without the MTP blocks (--no-mtp) and with
three (the release's), which ft drops.
"""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import pytest
import torch
from gguf.constants import MODEL_ARCH

from ftw import convert_checkpoint
from ftw.errors import UnsupportedArchitectureError
from ftw.gguf_convert import convert_gguf
from tests import checkpoints
from tests.checkpoints import load_all, save_checkpoint
from tests.gguf_export import add_base_keys, add_padded_vocab, config_differences
from tests.parity import assert_parity, convert_and_load
from tests.test_ftw_convert import assert_round_trip
from tests.test_ftw_gguf_hf import _gguf_name, collect_expert, write_gguf
from tests.test_parity import PROMPT, STEPS, hf_model

pytest.importorskip("transformers")

ARCH = gguf.MODEL_ARCH_NAMES[MODEL_ARCH.MIMO2]
NEXTN = 3  # (MimoV2Model._n_nextn: the release's MTP blocks)


def export_mimo2_gguf(src: Path, out: Path, *, mtp: bool = False, value_scale: bool = True,
                      floats: dict | None = None, extra: dict[str, torch.Tensor] | None = None) -> Path:
    """The file MimoV2Model writes; `mtp` with its three MTP blocks (layer 1's tensors again, and NextN's own),
    without `value_scale` no attention.value_scale; `floats` further float32 keys, `extra` further tensors."""
    c = json.loads((src / "config.json").read_text())
    layers, nextn = c["num_hidden_layers"], NEXTN if mtp else 0
    hybrid = [int(t == "sliding_attention") for t in c["layer_types"]] + [1] * nextn
    kv = c["num_key_value_heads"]
    full, swa = c["rope_parameters"]["full_attention"], c["rope_parameters"]["sliding_attention"]
    w = gguf.GGUFWriter(out, ARCH)
    add_base_keys(w, {**c, "rope_parameters": full, "num_key_value_heads": [2 * kv if h else kv for h in hybrid]},
                  block_count=layers + nextn)
    w.add_rope_freq_base_swa(swa["rope_theta"])  # (the base's, from the sliding layers' theta)
    w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)  # (the base's, from scoring_func "sigmoid")
    w.add_sliding_window(c["sliding_window"])  # (MimoV2Model's from here)
    w.add_sliding_window_pattern(hybrid)
    w.add_value_length(c["v_head_dim"])
    w.add_expert_feed_forward_length(c["moe_intermediate_size"])
    w.add_rope_dimension_count(int(c["head_dim"] * full["partial_rotary_factor"]))
    w.add_layer_norm_rms_eps(c["rms_norm_eps"])
    if value_scale:
        w.add_float32(f"{ARCH}.attention.value_scale", c["attention_value_scale"])
    if mtp:
        w.add_nextn_predict_layers(NEXTN)
    for key, value in (floats or {}).items():
        w.add_float32(f"{ARCH}.{key}", value)
    add_padded_vocab(w, c["vocab_size"], "qwen2", bos=c["bos_token_id"])
    maps = [gguf.get_tensor_name_map(MODEL_ARCH.MIMO2, layers + nextn)]
    tensors = {**load_all(src), **(extra or {})}
    for i in range(nextn):  # (model.mtp.layers.i renamed model.layers.{layers + i})
        tensors |= {n.replace("layers.1.", f"layers.{layers + i}."): t for n, t in tensors.items() if ".layers.1." in n}
        # (NextN's own, by llama.cpp's name: the installed gguf-py's mimo2 table lists none)
        w.add_tensor(f"blk.{layers + i}.nextn.eh_proj.weight", torch.zeros(c["hidden_size"], 2 * c["hidden_size"]).numpy())
    experts: dict = {}
    for name, t in tensors.items():
        if ".mlp.experts." in name:  # (modify_tensors: stacked per layer)
            collect_expert(experts, name, t)
            continue
        if "attention_sink" in name and not name.endswith(".weight"):
            name += ".weight"  # (filter_tensors)
        name = name.replace("e_score_correction_bias", "e_score_correction.bias")  # (ModelBase.filter_tensors)
        w.add_tensor(_gguf_name(maps, name), t.contiguous().numpy())
    for (_, merged), by_expert in sorted(experts.items()):
        stacked = torch.stack([by_expert[e] for e in range(len(by_expert))])
        w.add_tensor(_gguf_name(maps, merged), stacked.contiguous().numpy())
    return write_gguf(w, out)


@pytest.fixture(autouse=True)
def as_released(monkeypatch) -> None:
    """The release's routed_scaling_factor, null (1): llama.cpp's mimo2 applies none (the tiny model's is 1.5)."""
    configs = checkpoints.FAMILY_CONFIGS
    monkeypatch.setitem(configs, "mimo_v2_flash", {**configs["mimo_v2_flash"], "routed_scaling_factor": None})


@pytest.mark.parametrize("mtp", [False, True], ids=["no-mtp", "mtp"])
def test_mimo2_gguf_generates_what_transformers_does(tmp_path: Path, mtp: bool) -> None:
    """tests/checkpoints.py's mimo_v2_flash: full layers 0 and 3, sliding 1 and 2 (a window of 5, twice the
    key-value heads, random sinks), a third of each 24-wide key rotated at a base per kind, values 16 wide and
    scaled by 0.6, a dense first layer, two groups of four experts keeping one, attention biases."""
    src = save_checkpoint("mimo_v2_flash", tmp_path / "hf", seed=1)
    ours = convert_and_load(export_mimo2_gguf(src, tmp_path / "model.gguf", mtp=mtp), tmp_path / "store")
    assert_parity(ours, hf_model(src), PROMPT, STEPS)


def test_mimo2_gguf_config_and_tensors_are_the_checkpoints(tmp_path: Path) -> None:
    """The FTW config is the HF path's, every tensor and expert bank the checkpoint's bit for bit; the
    source config is the checkpoint's but for the per-type rope's partial factor, which the file gives as
    rotated channels (8 of 24: 1/3 for 0.334, the same 8)."""
    src = save_checkpoint("mimo_v2_flash", tmp_path / "hf")
    direct = convert_checkpoint(src, tmp_path / "ftw-hf")
    index = convert_gguf(export_mimo2_gguf(src, tmp_path / "model.gguf", mtp=True), tmp_path / "ftw")
    assert index.family == direct.family == "mimo_v2_flash"
    differences = config_differences(index.source_config, json.loads((src / "config.json").read_text()))
    assert set(differences) == {"rope_parameters"}, differences
    assert index.config == direct.config
    assert {t.name for t in index.tensors} == {t.name for t in direct.tensors}
    assert_round_trip(src, tmp_path / "ftw")  # every tensor and expert back under its HF name, bit for bit


def test_mimo2_gguf_without_value_scale_is_unscaled(tmp_path: Path) -> None:
    """No attention.value_scale: llama.cpp leaves the values unscaled, as transformers does for a null scale."""
    src = save_checkpoint("mimo_v2_flash", tmp_path / "hf", seed=2)
    c = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**c, "attention_value_scale": None}))
    ours = convert_and_load(export_mimo2_gguf(src, tmp_path / "model.gguf", value_scale=False), tmp_path / "store")
    assert_parity(ours, hf_model(src), PROMPT, STEPS)


def test_mimo2_gguf_refuses_what_llama_cpp_runs_otherwise(tmp_path: Path) -> None:
    """A routing scale (llama.cpp's mimo2 reads none) and a sink on a full layer (transformers has none
    there) are refused."""
    src = save_checkpoint("mimo_v2_flash", tmp_path / "hf")
    with pytest.raises(UnsupportedArchitectureError, match="expert_weights_scale"):
        convert_gguf(export_mimo2_gguf(src, tmp_path / "scale.gguf", floats={"expert_weights_scale": 1.5}),
                     tmp_path / "ftw-scale")
    sink = {"model.layers.0.self_attn.attention_sink_bias": torch.zeros(4)}
    with pytest.raises(UnsupportedArchitectureError, match="full layer 0"):
        convert_gguf(export_mimo2_gguf(src, tmp_path / "sink.gguf", extra=sink), tmp_path / "ftw-sink")
