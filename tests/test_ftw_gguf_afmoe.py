"""Arcee Trinity (afmoe) as a GGUF file (`afmoe`), written the way llama.cpp's converter writes it
(conversion/afmoe.py, AfmoeModel over LlamaModel, at llama.cpp 0c1e570), pulled through ft and run
against transformers.

`export_afmoe_gguf` follows that converter: the base keys (key_length from head_dim), LlamaModel's
vocab_size and rope.dimension_count, expert_shared_count, expert_feed_forward_length,
leading_dense_block_count, expert_weights_norm and _scale from route_norm and route_scale,
attention.sliding_window (no layer pattern: llama.cpp's default, every fourth layer full); q/k not
permuted (AfmoeModel bypasses LlamaModel.modify_tensors); the expert bias renamed expert_bias.bias;
gguf-py's names, the experts stacked; the vocabulary padded, pre-tokenizer "afmoe". The tiny config
has no route_norm; llama.cpp's graph comments give the release's (route_norm True, as transformers
always renormalizes), which the export writes.
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
from tests.checkpoints import load_all, save_checkpoint
from tests.gguf_export import add_base_keys, add_padded_vocab, config_differences
from tests.parity import assert_parity, convert_and_load
from tests.test_ftw_convert import assert_round_trip
from tests.test_ftw_gguf_hf import _gguf_name, add_stacked_experts, collect_expert, write_gguf
from tests.test_parity import PROMPT, STEPS, hf_model

pytest.importorskip("transformers")


def export_afmoe_gguf(src: Path, out: Path, *, route_norm: bool | None = True) -> Path:
    c = json.loads((src / "config.json").read_text())
    layers = c["num_hidden_layers"]
    w = gguf.GGUFWriter(out, "afmoe")
    add_base_keys(w, c)
    w.add_vocab_size(c["vocab_size"])  # (LlamaModel's)
    w.add_rope_dimension_count(c["head_dim"])
    w.add_expert_shared_count(c["num_shared_experts"])  # (AfmoeModel's)
    w.add_expert_feed_forward_length(c["moe_intermediate_size"])
    w.add_leading_dense_block_count(c["num_dense_layers"])
    if route_norm is not None:
        w.add_expert_weights_norm(route_norm)
    w.add_expert_weights_scale(c["route_scale"])
    w.add_sliding_window(c["sliding_window"])
    add_padded_vocab(w, c["vocab_size"], "afmoe", bos=c["bos_token_id"], eos=c["eos_token_id"])
    maps = [gguf.get_tensor_name_map(MODEL_ARCH.AFMOE, layers)]
    experts: dict = {}
    for name, t in load_all(src).items():
        if ".mlp.experts." in name:
            collect_expert(experts, name, t.float())
            continue
        name = name.replace(".expert_bias", ".expert_bias.bias")
        w.add_tensor(_gguf_name(maps, name), t.float().contiguous().numpy())
    add_stacked_experts(w, maps, experts)
    return write_gguf(w, out)


def test_afmoe_gguf_generates_what_transformers_does(tmp_path: Path) -> None:
    src = save_checkpoint("afmoe", tmp_path / "hf", seed=1)
    ours = convert_and_load(export_afmoe_gguf(src, tmp_path / "model.gguf"), tmp_path / "store")
    assert_parity(ours, hf_model(src), PROMPT, STEPS)


def test_afmoe_gguf_config_is_the_checkpoints(tmp_path: Path) -> None:
    """The FTW config and tensors from the GGUF are those from the Hugging Face checkpoint (the four
    norms a layer, the gate, the router, the layer kinds, muP, the route scale); a file llama.cpp
    would run without renormalizing is refused."""
    src = save_checkpoint("afmoe", tmp_path / "hf")
    direct = convert_checkpoint(src, tmp_path / "ftw-hf")
    index = convert_gguf(export_afmoe_gguf(src, tmp_path / "model.gguf"), tmp_path / "ftw")
    assert index.config == direct.config
    assert config_differences(index.source_config, json.loads((src / "config.json").read_text())) == {}
    assert {t.name for t in index.tensors} == {t.name for t in direct.tensors}
    assert_round_trip(src, tmp_path / "ftw")  # every tensor back under its HF name, bit for bit
    for route_norm in (False, None):
        with pytest.raises(UnsupportedArchitectureError, match="renormaliz"):
            convert_gguf(export_afmoe_gguf(src, tmp_path / f"{route_norm}.gguf", route_norm=route_norm),
                         tmp_path / f"ftw-{route_norm}")
