"""Sarvam-30B (sarvam_moe) as a GGUF file (`bailingmoe2`), written the way llama.cpp's converter writes
it (conversion/bailingmoe.py, SarvamMoEModel over BailingMoeV2Model, at llama.cpp 0c1e570), pulled
through ft and run against transformers.

`export_bailingmoe2_gguf` follows that converter, reading the release's names (query_key_value fused,
word_embeddings, attention.dense, query/key_layernorm, gate.expert_bias, which tests/checkpoints.py's
sarvam_moe checkpoint has): the base keys (key_length from head_dim, expert_gating_func sigmoid from
the release's score_function), rope.dimension_count the whole head (Sarvam's override),
leading_dense_block_count, vocab_size, expert_feed_forward_length, expert_shared_feed_forward_length,
expert_weights_scale and _norm, expert_shared_count, nextn_predict_layers; the expert bias renamed
expert_bias.bias and made zero-mean; q/k/v left fused and unpermuted; the experts stacked; gguf-py's
names; the vocabulary padded, pre-tokenizer "sarvam-moe".
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import gguf
import pytest
from gguf.constants import MODEL_ARCH
from safetensors.torch import load_file, save_file

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


def export_bailingmoe2_gguf(src: Path, out: Path, *, rotary_fraction: float = 1.0) -> Path:
    c = json.loads((src / "config.json").read_text())
    layers = c["num_hidden_layers"]
    w = gguf.GGUFWriter(out, "bailingmoe2")
    add_base_keys(w, c)
    w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)  # (the release's score_function)
    w.add_rope_dimension_count(int(c["head_dim"] * rotary_fraction))  # (SarvamMoEModel's: the whole head)
    w.add_leading_dense_block_count(c["first_k_dense_replace"])
    w.add_vocab_size(c["vocab_size"])
    w.add_expert_feed_forward_length(c["moe_intermediate_size"])
    w.add_expert_shared_feed_forward_length(c["moe_intermediate_size"] * c["n_shared_experts"])
    w.add_expert_weights_scale(c["routed_scaling_factor"])
    w.add_expert_shared_count(c["n_shared_experts"])
    w.add_expert_weights_norm(c["norm_topk_prob"])
    w.add_nextn_predict_layers(c["num_nextn_predict_layers"])
    add_padded_vocab(w, c["vocab_size"], "sarvam-moe", bos=c["bos_token_id"], eos=c["eos_token_id"])
    maps = [gguf.get_tensor_name_map(MODEL_ARCH.BAILINGMOE2, layers)]
    experts: dict = {}
    for name, t in load_all(src).items():
        t = t.float()
        if ".mlp.experts." in name:
            collect_expert(experts, name, t)
            continue
        if name.endswith(".expert_bias"):
            name, t = name + ".bias", t - t.mean()  # SarvamMoEModel.filter_tensors
        w.add_tensor(_gguf_name(maps, name), t.contiguous().numpy())
    add_stacked_experts(w, maps, experts)
    return write_gguf(w, out)


def test_bailingmoe2_gguf_generates_what_transformers_does(tmp_path: Path) -> None:
    src = save_checkpoint("sarvam_moe", tmp_path / "hf", seed=1)
    ours = convert_and_load(export_bailingmoe2_gguf(src, tmp_path / "model.gguf"), tmp_path / "store")
    assert_parity(ours, hf_model(src), PROMPT, STEPS)


def test_bailingmoe2_gguf_config_is_the_checkpoints(tmp_path: Path) -> None:
    """The FTW config and tensors from the GGUF are those from the Hugging Face checkpoint, bit for bit,
    but the expert bias, which the converter made zero-mean (the same routing); a Ling 2.0 file (part
    of each head rotated) is refused."""
    src = save_checkpoint("sarvam_moe", tmp_path / "hf")
    direct = convert_checkpoint(src, tmp_path / "ftw-hf")
    index = convert_gguf(export_bailingmoe2_gguf(src, tmp_path / "model.gguf"), tmp_path / "ftw")
    assert index.config == direct.config
    # (the release's class name, which llama.cpp's converter is registered for; transformers saves its own)
    assert config_differences(index.source_config, json.loads((src / "config.json").read_text())) == {
        "architectures": (["SarvamMoEForCausalLM"], ["Glm4MoeForCausalLM"])}
    assert {t.name for t in index.tensors} == {t.name for t in direct.tensors}
    # every tensor back under its HF name, bit for bit, against the checkpoint with its bias made zero-mean
    shifted = tmp_path / "hf-zero-mean"
    shutil.copytree(src, shifted)
    for shard in shifted.glob("*.safetensors"):
        tensors = load_file(shard)
        save_file({n: t - t.mean() if n.endswith(".expert_bias") else t for n, t in tensors.items()}, shard,
                  metadata={"format": "pt"})
    assert_round_trip(shifted, tmp_path / "ftw")
    with pytest.raises(UnsupportedArchitectureError, match="Ling 2.0"):
        convert_gguf(export_bailingmoe2_gguf(src, tmp_path / "ling.gguf", rotary_fraction=0.5), tmp_path / "ftw-ling")
