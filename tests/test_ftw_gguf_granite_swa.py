"""IBM Granite MoE with sliding-window attention (granitemoe_swa) as a GGUF file (`granite_swa`), written the
way llama.cpp's converter writes it (conversion/granite.py, GraniteMoeSWAModel over GraniteSWAModel,
GraniteModel, LlamaModel and TextModel, at llama.cpp 0c1e570), pulled through ft and run against transformers.

`export_granite_swa_gguf` follows that converter: the base keys (feed_forward_length the experts' width,
no key_length: GraniteModel drops head_dim), vocab_size and rope.dimension_count (LlamaModel's), Granite's
multipliers as attention.scale, embedding_scale, residual_scale and logit_scale, attention.sliding_window and
sliding_window_pattern (one bool a layer from layer_types), attention.rope_pattern, expert_shared_feed_forward_length
where a shared MLP is; q/k permuted (LlamaModel.permute), the sinks as attn_sinks.weight, the experts'
gate_up_proj as ffn_gate_up_exps and down_proj as ffn_down_exps, the shared MLP's input_linear as ffn_up_shexp
(gate rows then up, kept fused) and output_linear as ffn_down_shexp. The converter reads the release's
no_rope_layers (1: RoPE, 0: NoPE), which a transformers-saved config spells as layer_rope_theta (a base a
layer, 0 for NoPE), so the exporter maps it: a layer with a base is 1, and every base is the one rope_theta
(llama.cpp has one rope.freq_base): so are the checkpoints here. gguf 0.19 has no granite_swa architecture: its
granitemoe table gives the names it shares, llama-arch.cpp the rest (OWN_NAMES).
"""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf.constants import MODEL_ARCH

from ftw import convert_checkpoint
from ftw.errors import SourceError, UnsupportedArchitectureError
from ftw.gguf_convert import convert_gguf
from tests.checkpoints import FAMILY_CONFIGS, load_all, save_checkpoint
from tests.gguf_export import add_base_keys, add_padded_vocab, config_differences
from tests.parity import assert_parity, convert_and_load
from tests.test_ftw_convert import assert_round_trip
from tests.test_ftw_gguf_hf import _gguf_name, llama_cpp_permute, write_gguf
from tests.test_parity import PROMPT, STEPS, hf_model

pytest.importorskip("transformers")

# llama-arch.cpp's names for what gguf 0.19's granitemoe table does not map (after "model.layers.N.")
OWN_NAMES = {"self_attn.sinks": "attn_sinks.weight", "block_sparse_moe.router.weight": "ffn_gate_inp.weight",
             "block_sparse_moe.experts.gate_up_proj": "ffn_gate_up_exps.weight",
             "block_sparse_moe.experts.down_proj": "ffn_down_exps.weight",
             "shared_mlp.input_linear.weight": "ffn_up_shexp.weight",
             "shared_mlp.output_linear.weight": "ffn_down_shexp.weight"}
THETA = 10000.0


def save_granite_swa(out: Path, monkeypatch: pytest.MonkeyPatch, **overrides) -> Path:
    """The parity test's granitemoe_swa checkpoint (full, sliding, sliding, full layers, a window of 3, a
    shared MLP, Granite's multipliers) with RoPE at the one base on layers 0 and 2 and none on 1 and 3, and
    `overrides`."""
    config = {**FAMILY_CONFIGS["granitemoe_swa"], "layer_rope_theta": [THETA, 0, THETA, 0],
              "rope_parameters": {"rope_type": "default", "rope_theta": THETA}, **overrides}
    monkeypatch.setitem(FAMILY_CONFIGS, "granitemoe_swa", config)
    return save_checkpoint("granitemoe_swa", out, seed=1)


def export_granite_swa_gguf(src: Path, out: Path, *, keys: dict | None = None) -> Path:
    """The file GraniteMoeSWAModel writes from `src`; `keys`, further uint32 keys (or in place of
    rope.dimension_count)."""
    c = json.loads((src / "config.json").read_text())
    layers, theta = c["num_hidden_layers"], c["rope_parameters"]["rope_theta"]
    assert all(t in (0, theta) for t in c["layer_rope_theta"]), "one rope.freq_base"
    no_rope_layers = [1 if t else 0 for t in c["layer_rope_theta"]]  # (the release's name for it)
    w = gguf.GGUFWriter(out, "granite_swa")
    add_base_keys(w, c)
    w.add_vocab_size(c["vocab_size"])  # (LlamaModel's)
    keys = keys or {}
    if "rope.dimension_count" not in keys:
        w.add_rope_dimension_count(c["hidden_size"] // c["num_attention_heads"])
    for key, value in keys.items():
        w.add_uint32(f"granite_swa.{key}", value)
    w.add_attention_scale(c["attention_multiplier"])  # (GraniteModel's, each where truthy)
    w.add_embedding_scale(c["embedding_multiplier"])
    w.add_residual_scale(c["residual_multiplier"])
    w.add_logit_scale(c["logits_scaling"])
    w.add_sliding_window(c["sliding_window"])  # (GraniteSWAModel's)
    w.add_sliding_window_pattern([t == "sliding_attention" for t in c["layer_types"]])
    w.add_array("granite_swa.attention.rope_pattern", [bool(x) for x in no_rope_layers])
    if c["shared_intermediate_size"]:  # (GraniteMoeSWAModel's)
        w.add_expert_shared_feed_forward_length(c["shared_intermediate_size"])
    add_padded_vocab(w, c["vocab_size"], "gpt-2", bos=c.get("bos_token_id"), eos=c.get("eos_token_id"))
    maps = [gguf.get_tensor_name_map(MODEL_ARCH.GRANITE_MOE, layers)]
    for name, t in load_all(src).items():
        parts = name.split(".")
        own = OWN_NAMES.get(".".join(parts[3:])) if name.startswith("model.layers.") else None
        if name.endswith(("q_proj.weight", "k_proj.weight")):  # LlamaModel.modify_tensors (undo_permute)
            t = llama_cpp_permute(t, c["num_attention_heads"], c["num_key_value_heads"] if "k_proj" in name else None)
        array = np.ascontiguousarray(t.float().numpy())
        w.add_tensor(f"blk.{parts[2]}.{own}" if own else _gguf_name(maps, name), array)
    return write_gguf(w, out)


@pytest.mark.parametrize("shared", [48, 0], ids=["shared", "routed-only"])
def test_granite_swa_gguf_generates_what_transformers_does(tmp_path: Path, monkeypatch, shared: int) -> None:
    src = save_granite_swa(tmp_path / "hf", monkeypatch, shared_intermediate_size=shared)
    ours = convert_and_load(export_granite_swa_gguf(src, tmp_path / "model.gguf"), tmp_path / "store")
    assert ours.config.get("layer_rope_theta") == [THETA, 0, THETA, 0]
    assert ours.config.get("layer_types") == ["full_attention", "sliding_attention", "sliding_attention", "full_attention"]
    assert_parity(ours, hf_model(src), PROMPT, STEPS)


def test_granite_swa_gguf_config_is_the_checkpoints(tmp_path: Path, monkeypatch) -> None:
    """The FTW config and tensors from the GGUF are the HF path's (the layer kinds, the NoPE layers, the
    multipliers, the fused experts and shared MLP, the sinks), the source config the checkpoint's; every
    tensor back bit for bit (q/k permuted back)."""
    src = save_granite_swa(tmp_path / "hf", monkeypatch)
    direct = convert_checkpoint(src, tmp_path / "ftw-hf")
    index = convert_gguf(export_granite_swa_gguf(src, tmp_path / "model.gguf"), tmp_path / "ftw")
    assert index.family == direct.family == "granitemoe_swa"
    assert index.config == direct.config
    assert config_differences(index.source_config, json.loads((src / "config.json").read_text())) == {}
    assert {t.name for t in index.tensors} == {t.name for t in direct.tensors}
    assert_round_trip(src, tmp_path / "ftw")


def test_granite_swa_gguf_refusals(tmp_path: Path, monkeypatch) -> None:
    """A file without experts (GraniteSWA's dense model) refused by name; a rotation over part of each head,
    which granite-swa.cpp asserts against, is a damaged file."""
    src = save_granite_swa(tmp_path / "hf", monkeypatch)
    with pytest.raises(UnsupportedArchitectureError, match="GraniteSWA's dense model"):
        convert_gguf(export_granite_swa_gguf(src, tmp_path / "dense.gguf", keys={"expert_count": 0}),
                     tmp_path / "ftw-dense")
    with pytest.raises(SourceError, match="part of each head"):
        convert_gguf(export_granite_swa_gguf(src, tmp_path / "half.gguf", keys={"rope.dimension_count": 8}),
                     tmp_path / "ftw-half")
