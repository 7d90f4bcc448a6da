"""Llama 4 (llama4, text) as a GGUF file, written the way llama.cpp's converter writes it
(conversion/llama.py, Llama4Model over LlamaModel, at llama.cpp 0c1e570), pulled through ft and run
against transformers.

`export_llama4_gguf` follows that converter: the text config laid over the top level, intermediate_size
swapped with intermediate_size_mlp before the base keys (so feed_forward_length is the dense layers'
width), key_length from head_dim, LlamaModel's vocab_size and rope.dimension_count,
interleave_moe_layer_step, expert_feed_forward_length the experts' width, attention.sliding_window 0 only
where every layer is full attention; Llama 3 scaling as the rope_freqs tensor (generate_extra_tensors,
in its float32 arithmetic); the vision tower left out, `language_model.` dropped, q/k not permuted
(undo_permute False), gate_up_proj transposed and split into gate then up, down_proj transposed; a
byte-level vocabulary padded, pre-tokenizer "llama4".

llama.cpp's graph hard-codes what the checkpoint's config may say otherwise (chunks of 8192, the NoPE
layers' temperature 8192 and 0.1): the parity checkpoint has those values, so both sides agree.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from gguf.constants import MODEL_ARCH

from ftw import convert_checkpoint
from ftw.errors import UnsupportedArchitectureError
from ftw.gguf_config_more import llama3_rope_from_factors
from ftw.gguf_convert import convert_gguf
from ftw.gguf_file import GGUFModel
from ftw.gguf_source import architecture_for
from tests import checkpoints
from tests.checkpoints import load_all, save_checkpoint
from tests.gguf_export import add_base_keys, add_padded_vocab, config_differences
from tests.parity import assert_parity, convert_and_load
from tests.test_ftw_convert import assert_round_trip
from tests.test_ftw_gguf_hf import _gguf_name, write_gguf
from tests.test_parity import PROMPT, STEPS, hf_model

pytest.importorskip("transformers")

AS_LLAMA_CPP = dict(attention_chunk_size=8192, floor_scale=8192, attn_scale=0.1)  # what llama4.cpp hard-codes


def converter_rope_freqs(rope: dict, dim: int) -> torch.Tensor:
    """LlamaModel.generate_extra_tensors, as it computes them (float32 tensors)."""
    base = rope.get("rope_theta", 10000.0)
    freqs = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    factor, low, high = rope.get("factor", 8.0), rope.get("low_freq_factor", 1.0), rope.get("high_freq_factor", 4.0)
    old = rope.get("original_max_position_embeddings", 8192)
    low_wavelen, high_wavelen = old / low, old / high
    factors = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < high_wavelen:
            factors.append(1)
        elif wavelen > low_wavelen:
            factors.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            factors.append(1 / ((1 - smooth) / factor + smooth))
    return torch.tensor(factors, dtype=torch.float32)


def export_llama4_gguf(src: Path, out: Path, *, rope_freqs: torch.Tensor | None = None,
                       expert_count: int | None = None) -> Path:
    top = json.loads((src / "config.json").read_text())
    c = {**top, **top["text_config"]}
    c = {**c, "intermediate_size": c["intermediate_size_mlp"], "intermediate_size_moe": c["intermediate_size"]}
    layers = c["num_hidden_layers"]
    w = gguf.GGUFWriter(out, "llama4")
    add_base_keys(w, {**c, "num_local_experts": expert_count or c["num_local_experts"]})
    w.add_vocab_size(c["vocab_size"])  # (LlamaModel's)
    w.add_rope_dimension_count(c["head_dim"])
    w.add_interleave_moe_layer_step(c["interleave_moe_layer_step"])  # (Llama4Model's)
    w.add_expert_feed_forward_length(c["intermediate_size_moe"])
    if all(kind == "full_attention" for kind in c.get("layer_types", ["chunked_attention"])):
        w.add_sliding_window(0)
    add_padded_vocab(w, c["vocab_size"], "llama4", bos=c["bos_token_id"], eos=c["eos_token_id"])
    rope = c["rope_parameters"]
    if rope_freqs is None and rope.get("rope_type") == "llama3":
        rope_freqs = converter_rope_freqs(rope, c["head_dim"])
    if rope_freqs is not None:
        w.add_tensor("rope_freqs.weight", rope_freqs.numpy())
    maps = [gguf.get_tensor_name_map(MODEL_ARCH.LLAMA4, layers)]
    for name, t in load_all(src).items():
        if name.startswith(("vision_model.", "multi_modal_projector.")):
            continue  # (the mmproj file's)
        name, t = name.replace("language_model.", ""), t.float()
        if name.endswith("gate_up_proj"):
            gate, up = t.transpose(-1, -2).split(t.shape[-1] // 2, dim=-2)
            for part, data in (("gate_proj.weight", gate), ("up_proj.weight", up)):
                w.add_tensor(_gguf_name(maps, name.replace("gate_up_proj", part)), data.contiguous().numpy())
            continue
        if name.endswith("down_proj"):
            name, t = name + ".weight", t.transpose(-1, -2)
        w.add_tensor(_gguf_name(maps, name), t.contiguous().numpy())
    return write_gguf(w, out)


@pytest.fixture
def as_llama_cpp(monkeypatch) -> None:
    monkeypatch.setattr(checkpoints, "LLAMA4_TEXT", {**checkpoints.LLAMA4_TEXT, **AS_LLAMA_CPP})


def test_llama4_gguf_generates_what_transformers_does(tmp_path: Path, as_llama_cpp) -> None:
    src = save_checkpoint("llama4", tmp_path / "hf", seed=1)
    ours = convert_and_load(export_llama4_gguf(src, tmp_path / "model.gguf"), tmp_path / "store")
    assert ours.config.get("rope_parameters")["rope_type"] == "llama3"
    assert_parity(ours, hf_model(src), PROMPT, STEPS)


def test_llama4_gguf_config_and_tensors_are_the_checkpoints(tmp_path: Path, as_llama_cpp) -> None:
    """The FTW config and every tensor are the checkpoint's, bit for bit; the source config is its text
    config (Llama 3 scaling read back from rope_freqs) but for the model type and the class."""
    src = save_checkpoint("llama4", tmp_path / "hf")
    top = json.loads((src / "config.json").read_text())
    direct = convert_checkpoint(src, tmp_path / "ftw-hf")
    index = convert_gguf(export_llama4_gguf(src, tmp_path / "model.gguf"), tmp_path / "ftw")
    assert index.config == direct.config
    assert config_differences(index.source_config, top["text_config"]) == {"model_type": ("llama4", "llama4_text")}
    assert config_differences(index.source_config, top) == {}
    assert {t.name for t in index.tensors} == {t.name for t in direct.tensors}
    assert_round_trip(src, tmp_path / "ftw")  # every text tensor back under its HF name, bit for bit


def test_llama4_gguf_refuses_what_llama_cpp_runs_otherwise(tmp_path: Path) -> None:
    """Every layer full attention (sliding_window 0), and rope_freqs no Llama 3 scaling gives, are refused;
    128 experts (Maverick) turn the q/k norm off, as llama.cpp decides it."""
    src = save_checkpoint("llama4", tmp_path / "hf")
    config = json.loads((src / "config.json").read_text())
    full = tmp_path / "full"
    full.mkdir()
    for f in src.iterdir():
        (full / f.name).write_bytes(f.read_bytes())
    config["text_config"]["layer_types"] = ["full_attention"] * 4
    (full / "config.json").write_text(json.dumps(config))
    with pytest.raises(UnsupportedArchitectureError, match="sliding_window 0"):
        convert_gguf(export_llama4_gguf(full, tmp_path / "full.gguf"), tmp_path / "ftw-full")
    odd = torch.tensor([1.0, 3.0, 1.5, 8.0, 8.0, 8.0, 8.0, 8.0])
    with pytest.raises(UnsupportedArchitectureError, match="rope_freqs"):
        convert_gguf(export_llama4_gguf(src, tmp_path / "odd.gguf", rope_freqs=odd), tmp_path / "ftw-odd")
    for count, qk_norm in ((4, True), (128, False)):
        model = GGUFModel(export_llama4_gguf(src, tmp_path / f"{count}.gguf", expert_count=count))
        assert architecture_for(model).hf_config(model)["use_qk_norm"] is qk_norm


@pytest.mark.parametrize("rope", [
    # Llama 4 Scout's (low and high alike: no channel between), Llama 3.1's, a tiny head's
    dict(rope_theta=500000.0, factor=16.0, low_freq_factor=1.0, high_freq_factor=1.0, original_max_position_embeddings=8192),
    dict(rope_theta=500000.0, factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=8192),
    dict(rope_theta=10000.0, factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=64),
], ids=["scout", "llama3.1", "tiny"])
def test_llama3_scaling_comes_back_from_rope_freqs(rope: dict) -> None:
    dim = 128 if rope["rope_theta"] == 500000.0 else 16
    factors = converter_rope_freqs(rope, dim).double().numpy()
    theta = rope.pop("rope_theta")
    assert llama3_rope_from_factors(factors, theta, dim) == rope
    assert llama3_rope_from_factors(np.ones(dim // 2), theta, dim) is None
