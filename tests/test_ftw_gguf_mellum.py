"""JetBrains Mellum 2 (mellum) as a GGUF file (`mellum`), written the way llama.cpp's converter writes it
(conversion/mellum.py, MellumModel over TextModel, at llama.cpp 0c1e570), pulled through ft and run against
transformers.

`export_mellum_gguf` follows that converter: the base keys (key_length from head_dim, rope.freq_base from
rope_parameters' full_attention and rope.freq_base_swa from its sliding_attention), expert_feed_forward_length,
attention.sliding_window and sliding_window_pattern (one bool a layer from layer_types); the experts stacked;
the vocabulary padded, pre-tokenizer "mellum2". gguf 0.19 has no mellum architecture: the names are its
qwen3moe table's, which are llama-arch.cpp's for mellum (LLM_ARCH_MELLUM's tensors: token_embd, output_norm,
output, attn_norm, attn_q/k/v/output, attn_q_norm/k_norm, ffn_norm, ffn_gate_inp, ffn_{gate,up,down}_exps).

llama.cpp's mellum loads a router on every layer (src/models/mellum.cpp), so the checkpoint is the parity
test's with every layer MoE (its layer 0 is dense there).
"""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import pytest
from gguf.constants import MODEL_ARCH

from ftw import convert_checkpoint
from ftw.errors import SourceError, UnsupportedArchitectureError
from ftw.gguf_convert import convert_gguf
from tests.checkpoints import FAMILY_CONFIGS, RANDOMIZED, load_all, save_checkpoint
from tests.gguf_export import add_base_keys, add_padded_vocab, add_yarn_keys, config_differences
from tests.parity import assert_parity, convert_and_load
from tests.test_ftw_convert import assert_round_trip
from tests.test_ftw_gguf_hf import _gguf_name, add_stacked_experts, collect_expert, write_gguf
from tests.test_parity import PROMPT, STEPS, hf_model

pytest.importorskip("transformers")


def save_mellum(out: Path, monkeypatch: pytest.MonkeyPatch, **overrides) -> Path:
    """The parity test's mellum checkpoint (sliding, full, sliding within 5 tokens at bases 1000 and 50000,
    random norms) with every layer MoE and `overrides`."""
    config = {**FAMILY_CONFIGS["mellum"], "mlp_layer_types": ["sparse"] * 3, **overrides}
    monkeypatch.setitem(FAMILY_CONFIGS, "mellum", config)
    assert "q_norm." in RANDOMIZED["mellum"]
    return save_checkpoint("mellum", out, seed=1)


def export_mellum_gguf(src: Path, out: Path, *, keys: dict | None = None, yarn: dict | None = None) -> Path:
    """The file MellumModel writes from `src`; `keys`, further uint32 keys; `yarn`, the base's YaRN keys as
    from those full_attention rope parameters."""
    c = json.loads((src / "config.json").read_text())
    layers, rope = c["num_hidden_layers"], c["rope_parameters"]
    w = gguf.GGUFWriter(out, "mellum")
    add_base_keys(w, c)
    w.add_rope_freq_base(rope.get("full_attention", rope)["rope_theta"])  # (the base's, keyed by layer type)
    if "sliding_attention" in rope:
        w.add_rope_freq_base_swa(rope["sliding_attention"]["rope_theta"])
    if yarn is not None:
        add_yarn_keys(w, yarn)
    w.add_expert_feed_forward_length(c["moe_intermediate_size"])  # (MellumModel's)
    if c.get("sliding_window") is not None:
        w.add_sliding_window(c["sliding_window"])
        w.add_sliding_window_pattern([t == "sliding_attention" for t in c["layer_types"]])
    for key, value in (keys or {}).items():
        w.add_uint32(f"mellum.{key}", value)
    add_padded_vocab(w, c["vocab_size"], "mellum2", bos=c.get("bos_token_id"), eos=c.get("eos_token_id"))
    maps = [gguf.get_tensor_name_map(MODEL_ARCH.QWEN3MOE, layers)]
    experts: dict = {}
    for name, t in load_all(src).items():
        if ".mlp.experts." in name:
            collect_expert(experts, name, t.float())
            continue
        w.add_tensor(_gguf_name(maps, name), t.float().contiguous().numpy())
    add_stacked_experts(w, maps, experts)
    return write_gguf(w, out)


def test_mellum_gguf_generates_what_transformers_does(tmp_path: Path, monkeypatch) -> None:
    src = save_mellum(tmp_path / "hf", monkeypatch)
    ours = convert_and_load(export_mellum_gguf(src, tmp_path / "model.gguf"), tmp_path / "store")
    assert_parity(ours, hf_model(src), PROMPT, STEPS)


def test_mellum_gguf_config_is_the_checkpoints(tmp_path: Path, monkeypatch) -> None:
    """The FTW config and tensors from the GGUF are the HF path's (the layer kinds, each kind's rope base, the
    window), the source config the checkpoint's; a partial rotation is refused (llama.cpp asserts the whole head)."""
    src = save_mellum(tmp_path / "hf", monkeypatch)
    direct = convert_checkpoint(src, tmp_path / "ftw-hf")
    index = convert_gguf(export_mellum_gguf(src, tmp_path / "model.gguf"), tmp_path / "ftw")
    assert index.family == direct.family == "mellum"
    assert index.config == direct.config
    assert config_differences(index.source_config, json.loads((src / "config.json").read_text())) == {}
    assert {t.name for t in index.tensors} == {t.name for t in direct.tensors}
    assert_round_trip(src, tmp_path / "ftw")
    with pytest.raises(SourceError, match="part of each head"):
        convert_gguf(export_mellum_gguf(src, tmp_path / "half.gguf", keys={"rope.dimension_count": 8}),
                     tmp_path / "ftw-half")


def test_mellum_gguf_without_a_window_is_all_full(tmp_path: Path, monkeypatch) -> None:
    """A config without a sliding_window: no window keys, every layer full at the full layers' base, as
    llama.cpp's loader runs it and transformers does (layer types full)."""
    src = save_mellum(tmp_path / "hf", monkeypatch, sliding_window=None, layer_types=["full_attention"] * 3)
    ours = convert_and_load(export_mellum_gguf(src, tmp_path / "model.gguf"), tmp_path / "store")
    assert ours.config.get("layer_types") == ["full_attention"] * 3
    assert_parity(ours, hf_model(src), PROMPT, STEPS)


def test_mellum_gguf_with_rope_scaling_is_refused(tmp_path: Path, monkeypatch) -> None:
    """YaRN on the full layers (the base's keys from rope_parameters' full_attention) is refused by name."""
    src = save_mellum(tmp_path / "hf", monkeypatch)
    yarn = dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=64, beta_fast=32.0, beta_slow=1.0)
    with pytest.raises(UnsupportedArchitectureError, match="RoPE scaling"):
        convert_gguf(export_mellum_gguf(src, tmp_path / "yarn.gguf", yarn=yarn), tmp_path / "ftw-yarn")
