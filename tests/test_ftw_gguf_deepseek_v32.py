"""DeepSeek-V3.2 (deepseek_v32) as a GGUF file (`deepseek32`), written the way llama.cpp's converter writes it
(conversion/deepseek.py:464 at llama.cpp 0c1e570: DeepseekV32Model over DeepseekV2Model), pulled through ft and
run against transformers.

`export_deepseek32_gguf` follows that converter: the base keys (expert_group_count/_used_count from n_group
and topk_group, expert_gating_func sigmoid from the release's scoring_func, which the checkpoint's config keeps
as the release's does), DeepseekV2Model's (head_count_kv 1, leading_dense_block_count, vocab_size, the LoRA
ranks, the MLA lengths, expert widths and counts, expert_weights_scale, expert_weights_norm,
rope.dimension_count), DeepseekV32Model's nextn_predict_layers (its MTP blocks kept: skip_mtp False) and the
indexer's head count, key length and top-k; kv_b_proj split into attn_k_b (transposed per head) and attn_v_b,
the experts stacked per layer, the correction bias renamed so gguf-py's table finds it (gguf 0.19 has no
deepseek32: glm-dsa's table names the same tensors); _set_vocab_gpt2's byte-level vocabulary, padded.
"""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import pytest
from gguf.constants import MODEL_ARCH

from ftw import convert_checkpoint
from ftw.errors import UnsupportedArchitectureError
from ftw.gguf_convert import convert_gguf
from tests.checkpoints import FAMILY_CONFIGS, load_all, save_checkpoint
from tests.gguf_export import add_base_keys, add_deepseek2_keys, add_padded_vocab, config_differences
from tests.parity import assert_parity, convert_and_load
from tests.test_ftw_convert import assert_round_trip
from tests.test_ftw_gguf_hf import add_deepseek2_tensors, with_nextn_block, write_gguf
from tests.test_parity import PROMPT, STEPS, hf_model

pytest.importorskip("transformers")


def save_v32(out: Path, monkeypatch: pytest.MonkeyPatch, **overrides) -> Path:
    """The parity test's deepseek_v32 checkpoint (an indexer on each of 4 layers keeping 6 tokens, two dense
    layers first, two groups of four experts keeping one), scoring_func "sigmoid" as the release's config says."""
    monkeypatch.setitem(FAMILY_CONFIGS, "deepseek_v32", {**FAMILY_CONFIGS["deepseek_v32"], "scoring_func": "sigmoid",
                                                         **overrides})
    return save_checkpoint("deepseek_v32", out, seed=1)


def export_deepseek32_gguf(src: Path, out: Path, *, mtp: bool = False, gating: int | None = 2) -> Path:
    """The file DeepseekV32Model writes from `src`; `mtp`, with an MTP block after the last layer (block_count
    one more, nextn_predict_layers 1); `gating`, the expert_gating_func written (None: none)."""
    c = json.loads((src / "config.json").read_text())
    layers = c["num_hidden_layers"]
    w = gguf.GGUFWriter(out, "deepseek32")
    add_base_keys(w, {**c, "num_key_value_heads": 1}, block_count=layers + mtp)
    if gating is not None:  # (the base's, from scoring_func)
        w.add_expert_gating_func(gguf.ExpertGatingFuncType(gating))
    add_deepseek2_keys(w, c)
    if mtp:  # (DeepseekV32Model's from here)
        w.add_nextn_predict_layers(1)
    w.add_uint32("deepseek32.attention.indexer.head_count", c["index_n_heads"])
    w.add_uint32("deepseek32.attention.indexer.key_length", c["index_head_dim"])
    w.add_uint32("deepseek32.attention.indexer.top_k", c["index_topk"])
    add_padded_vocab(w, c["vocab_size"], "deepseek-v3", bos=c["bos_token_id"], eos=c["eos_token_id"])
    maps = [gguf.get_tensor_name_map(MODEL_ARCH.GLM_DSA, layers + mtp)]
    tensors = load_all(src)
    add_deepseek2_tensors(w, maps, c, with_nextn_block(tensors, c, layers) if mtp else tensors,
                          nextn_layer=layers if mtp else None)
    return write_gguf(w, out)


@pytest.mark.parametrize("mtp", [False, True], ids=["plain", "nextn"])
def test_deepseek_v32_gguf_generates_what_transformers_does(tmp_path: Path, monkeypatch, mtp: bool) -> None:
    src = save_v32(tmp_path / "hf", monkeypatch)
    ours = convert_and_load(export_deepseek32_gguf(src, tmp_path / "model.gguf", mtp=mtp), tmp_path / "store")
    assert_parity(ours, hf_model(src), PROMPT, STEPS)


def test_deepseek_v32_gguf_config_and_tensors_are_the_checkpoints(tmp_path: Path, monkeypatch) -> None:
    """The FTW config is the HF path's, the source config the checkpoint's, every tensor and expert bank the
    checkpoint's bit for bit (kv_b_proj rebuilt from its halves; the MTP block dropped)."""
    src = save_v32(tmp_path / "hf", monkeypatch)
    direct = convert_checkpoint(src, tmp_path / "ftw-hf")
    index = convert_gguf(export_deepseek32_gguf(src, tmp_path / "model.gguf", mtp=True), tmp_path / "ftw")
    assert index.family == direct.family == "deepseek_v32"
    assert index.config == direct.config
    assert config_differences(index.source_config, json.loads((src / "config.json").read_text())) == {}
    assert {t.name for t in index.tensors} == {t.name for t in direct.tensors}
    assert [(b.layer, b.parts) for b in index.banks] == [(b.layer, b.parts) for b in direct.banks]
    assert_round_trip(src, tmp_path / "ftw")


@pytest.mark.parametrize("gating", [None, 1], ids=["none", "softmax"])
def test_deepseek_v32_gguf_refuses_other_routing(tmp_path: Path, monkeypatch, gating: int | None) -> None:
    """No expert_gating_func (llama.cpp's deepseek32 loader requires one) or softmax: refused by name."""
    src = save_v32(tmp_path / "hf", monkeypatch)
    with pytest.raises(UnsupportedArchitectureError, match="routes by sigmoid"):
        convert_gguf(export_deepseek32_gguf(src, tmp_path / "model.gguf", gating=gating), tmp_path / "ftw")
