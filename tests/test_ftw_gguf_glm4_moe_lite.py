"""GLM-4.7-Flash (glm4_moe_lite) as a GGUF file (`deepseek2`), written the way llama.cpp's converter writes it
(conversion/glm.py:247 at llama.cpp 0c1e570: Glm4MoeLiteModel over DeepseekV2Model), pulled through ft and
run against transformers.

`export_glm4_moe_lite_gguf` follows that converter: the base keys (head_count_kv 1, as DeepseekV2Model sets
it for MLA; expert_group_count/_used_count from n_group and topk_group; expert_gating_func from scoring_func
where the config has one), DeepseekV2Model's (leading_dense_block_count from first_k_dense_replace,
vocab_size, the LoRA ranks, the MLA lengths, expert widths and counts, expert_weights_scale,
expert_weights_norm where true, rope.dimension_count), Glm4MoeLiteModel's nextn_predict_layers where MTP
blocks are kept; kv_b_proj split into attn_k_b (transposed per head) and attn_v_b, the experts stacked per
layer, the correction bias renamed so gguf-py's table finds it; _set_vocab_glm's byte-level vocabulary
(pre-tokenizer "glm4"), padded, bos [gMASK].

llama.cpp reads the MoE layers from leading_dense_block_count alone, so the checkpoint has one dense layer
first (first_k_dense_replace 1 beside mlp_layer_types, which Glm4MoeLiteConfig reads instead) and not the
parity test's dense layers between MoE ones.
"""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import pytest
from gguf.constants import MODEL_ARCH

from ftw import convert_checkpoint
from ftw.gguf_convert import convert_gguf
from tests.checkpoints import FAMILY_CONFIGS, RANDOMIZED, load_all, save_checkpoint
from tests.gguf_export import add_base_keys, add_deepseek2_keys, add_padded_vocab, config_differences
from tests.parity import assert_parity, convert_and_load
from tests.test_ftw_convert import assert_round_trip
from tests.test_ftw_gguf_hf import add_deepseek2_tensors, with_nextn_block, write_gguf
from tests.test_parity import PROMPT, STEPS, hf_model

pytest.importorskip("transformers")

GMASK = 5  # [gMASK], the bos _set_vocab_glm writes


def save_glm_lite(out: Path, monkeypatch: pytest.MonkeyPatch, **overrides) -> Path:
    """The parity test's glm4_moe_lite checkpoint with leading dense layers only, a sigmoid scoring_func,
    random correction biases and norms, and `overrides`."""
    layers = FAMILY_CONFIGS["glm4_moe_lite"]["num_hidden_layers"]
    config = {**FAMILY_CONFIGS["glm4_moe_lite"], "first_k_dense_replace": 1, "scoring_func": "sigmoid",
              "mlp_layer_types": ["dense"] + ["sparse"] * (layers - 1), **overrides}
    monkeypatch.setitem(FAMILY_CONFIGS, "glm4_moe_lite", config)
    monkeypatch.setitem(RANDOMIZED, "glm4_moe_lite", ("e_score_correction_bias", "layernorm.", "model.norm."))
    return save_checkpoint("glm4_moe_lite", out, seed=1)


def export_glm4_moe_lite_gguf(src: Path, out: Path, *, mtp: bool = False) -> Path:
    """The file Glm4MoeLiteModel writes from `src`; `mtp`, with a NextN block after the last layer
    (block_count one more, nextn_predict_layers 1)."""
    c = json.loads((src / "config.json").read_text())
    layers = c["num_hidden_layers"]
    w = gguf.GGUFWriter(out, "deepseek2")
    add_base_keys(w, {**c, "num_key_value_heads": 1}, block_count=layers + mtp)
    if c.get("scoring_func") == "sigmoid":  # (the base's)
        w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
    add_deepseek2_keys(w, c)
    if mtp:
        w.add_nextn_predict_layers(1)
    add_padded_vocab(w, c["vocab_size"], "glm4", bos=GMASK, eos=c["eos_token_id"], unk=2)
    maps = [gguf.get_tensor_name_map(MODEL_ARCH.DEEPSEEK2, layers + mtp)]
    tensors = load_all(src)
    add_deepseek2_tensors(w, maps, c, with_nextn_block(tensors, c, layers) if mtp else tensors,
                          nextn_layer=layers if mtp else None)
    return write_gguf(w, out)


@pytest.mark.parametrize("mtp", [False, True], ids=["plain", "nextn"])
def test_glm4_moe_lite_gguf_generates_what_transformers_does(tmp_path: Path, monkeypatch, mtp: bool) -> None:
    src = save_glm_lite(tmp_path / "hf", monkeypatch)
    ours = convert_and_load(export_glm4_moe_lite_gguf(src, tmp_path / "model.gguf", mtp=mtp), tmp_path / "store")
    assert_parity(ours, hf_model(src), PROMPT, STEPS)


def test_glm4_moe_lite_gguf_config_and_tensors_are_the_checkpoints(tmp_path: Path, monkeypatch) -> None:
    """The family is glm4_moe_lite (by the "glm4" vocabulary), the FTW config the HF path's, the source config
    the checkpoint's but for the bos the converter writes, every tensor and expert bank the checkpoint's, bit
    for bit (kv_b_proj rebuilt from its halves; the NextN block dropped)."""
    src = save_glm_lite(tmp_path / "hf", monkeypatch)
    direct = convert_checkpoint(src, tmp_path / "ftw-hf")
    index = convert_gguf(export_glm4_moe_lite_gguf(src, tmp_path / "model.gguf", mtp=True), tmp_path / "ftw")
    assert index.family == direct.family == "glm4_moe_lite"
    assert index.config == direct.config
    differences = config_differences(index.source_config, json.loads((src / "config.json").read_text()))
    assert differences == {"bos_token_id": (GMASK, 0)}, differences  # (_set_vocab_glm's bos is [gMASK])
    assert {t.name for t in index.tensors} == {t.name for t in direct.tensors}
    assert [(b.layer, [(p.name, p.dtype, p.shape) for p in b.parts]) for b in index.banks] == \
        [(b.layer, [(p.name, p.dtype, p.shape) for p in b.parts]) for b in direct.banks]
    assert_round_trip(src, tmp_path / "ftw")


def test_glm4_moe_lite_gguf_without_a_gating_key_routes_as_llama_cpp_does(tmp_path: Path, monkeypatch) -> None:
    """Converted from a config without scoring_func the file has no expert_gating_func, which llama.cpp's loader
    reads as softmax unless the file is GLM-4.7-Flash's shape (47 or 48 blocks, 154880 tokens): a tiny one is
    DeepSeek-V2 to both."""
    src = save_glm_lite(tmp_path / "hf", monkeypatch, scoring_func=None)
    index = convert_gguf(export_glm4_moe_lite_gguf(src, tmp_path / "model.gguf"), tmp_path / "ftw")
    assert index.family == "deepseek_v2"
