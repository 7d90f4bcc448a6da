"""K-EXAONE (exaone_moe) as a GGUF file (`exaone-moe`), written the way llama.cpp's converter writes
it (conversion/exaone.py, ExaoneMoEModel over Exaone4Model, at llama.cpp 0c1e570), pulled through ft
and run against transformers.

`export_exaone_moe_gguf` follows that converter: the base keys (key_length from head_dim,
feed_forward_length the dense layer's width, the group keys), the experts' and shared experts'
widths, expert_weights_scale/_norm, leading_dense_block_count, the sliding window and one bool a
layer from layer_types, nextn_predict_layers with the MTP block after the last layer; gguf-py's
names (the correction bias renamed e_score_correction.bias first, as the base converter does), the
experts stacked; the vocabulary padded with [PAD] tokens, pre-tokenizer "exaone-moe".
"""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf.constants import MODEL_ARCH

from ftw import convert_checkpoint
from ftw.errors import UnsupportedArchitectureError
from ftw.gguf_convert import convert_gguf
from tests.checkpoints import load_all, save_checkpoint
from tests.gguf_export import add_base_keys, add_padded_vocab, config_differences
from tests.parity import assert_parity, convert_and_load
from tests.test_ftw_convert import assert_round_trip
from tests.test_ftw_gguf_hf import _gguf_name, add_stacked_experts, collect_expert, write_gguf
from tests.test_parity import PROMPT, STEPS, hf_model

pytest.importorskip("transformers")


def export_exaone_moe_gguf(src: Path, out: Path, *, mtp: bool = True, gating: int | None = 2) -> Path:
    """`gating`: the expert_gating_func the base converter writes from a scoring_func key (K-EXAONE's
    release must carry one: llama.cpp's loader requires the key); None writes none."""
    c = json.loads((src / "config.json").read_text())
    layers = c["num_hidden_layers"]
    w = gguf.GGUFWriter(out, "exaone-moe")
    add_base_keys(w, c, block_count=layers + mtp)
    if gating is not None:
        w.add_expert_gating_func(gguf.ExpertGatingFuncType(gating))
    w.add_vocab_size(c["vocab_size"])  # (Exaone4Model's)
    w.add_sliding_window(c["sliding_window"])
    w.add_sliding_window_pattern([t == "sliding_attention" for t in c["layer_types"]])
    w.add_expert_feed_forward_length(c["moe_intermediate_size"])  # (ExaoneMoEModel's)
    w.add_expert_shared_count(c["num_shared_experts"])
    w.add_expert_shared_feed_forward_length(c["moe_intermediate_size"] * c["num_shared_experts"])
    w.add_expert_weights_scale(c["routed_scaling_factor"])
    w.add_expert_weights_norm(c["norm_topk_prob"])
    w.add_leading_dense_block_count(c["first_k_dense_replace"])
    w.add_nextn_predict_layers(int(mtp))
    w.add_rope_scaling_type(gguf.RopeScalingType.NONE)
    add_padded_vocab(w, c["vocab_size"], "exaone-moe", bos=c["bos_token_id"], eos=c["eos_token_id"])
    maps = [gguf.get_tensor_name_map(MODEL_ARCH.EXAONE_MOE, layers + mtp)]
    experts: dict = {}
    for name, t in load_all(src).items():
        if ".mlp.experts." in name:
            collect_expert(experts, name, t.float())
            continue
        name = name.replace("e_score_correction_bias", "e_score_correction.bias")
        w.add_tensor(_gguf_name(maps, name), t.float().contiguous().numpy())
    add_stacked_experts(w, maps, experts)
    if mtp:  # an MTP block after the last layer (mtp.* renamed to it), which ft drops as llama.cpp skips it
        hidden = c["hidden_size"]
        w.add_tensor(f"blk.{layers}.nextn.eh_proj.weight", np.zeros((hidden, 2 * hidden), np.float32))
        w.add_tensor(f"blk.{layers}.attn_norm.weight", np.ones(hidden, np.float32))
    return write_gguf(w, out)


def test_exaone_moe_gguf_generates_what_transformers_does(tmp_path: Path) -> None:
    src = save_checkpoint("exaone_moe", tmp_path / "hf", seed=1)
    ours = convert_and_load(export_exaone_moe_gguf(src, tmp_path / "model.gguf"), tmp_path / "store")
    assert_parity(ours, hf_model(src), PROMPT, STEPS)


def test_exaone_moe_gguf_config_is_the_checkpoints(tmp_path: Path) -> None:
    """The FTW config and tensors from the GGUF are those from the Hugging Face checkpoint (the dense
    first layer, the window layout, the groups, the shared expert), the MTP block dropped; a file
    without expert_gating_func reads as sigmoid, a softmax one is refused."""
    src = save_checkpoint("exaone_moe", tmp_path / "hf")
    direct = convert_checkpoint(src, tmp_path / "ftw-hf")
    for gating in (2, None):
        index = convert_gguf(export_exaone_moe_gguf(src, tmp_path / f"{gating}.gguf", gating=gating),
                             tmp_path / f"ftw-{gating}")
        assert index.config == direct.config
        assert config_differences(index.source_config, json.loads((src / "config.json").read_text())) == {}
        assert {t.name for t in index.tensors} == {t.name for t in direct.tensors}
        assert_round_trip(src, tmp_path / f"ftw-{gating}")  # every tensor back under its HF name, bit for bit
    with pytest.raises(UnsupportedArchitectureError, match="sigmoid"):
        convert_gguf(export_exaone_moe_gguf(src, tmp_path / "softmax.gguf", gating=1), tmp_path / "ftw-softmax")
