"""Poolside Laguna (laguna) as a GGUF file (`laguna`), written the way llama.cpp's converter writes it
(conversion/laguna.py, LagunaModel over TextModel, at llama.cpp 0c1e570), pulled through ft and run against
transformers.

`export_laguna_gguf` follows that converter: the base keys (feed_forward_length from intermediate_size,
rope.freq_base from rope_parameters' full_attention and rope.freq_base_swa from its sliding_attention, YaRN's
keys from the full layers' parameters, key_length from head_dim), vocab_size, head_count one a layer,
attention.sliding_window where the config has one, expert_feed_forward_length, expert_shared_feed_forward_length,
expert_weights_norm true, expert_weights_scale, expert_gating_func sigmoid, leading_dense_block_count,
rope.dimension_count (and _swa) from each kind's partial_rotary_factor; the experts stacked. gguf 0.19 has no
laguna architecture: the names are its qwen3moe and deepseek2 tables' (the dense MLP), with the three
llama-arch.cpp gives laguna beyond them written as laguna.cpp loads them (attn_gate, exp_probs_b.bias,
ffn_*_shexp).

llama.cpp reads no layer kinds from the file (the converter writes no sliding_window_pattern: laguna.cpp's
load_swa_pattern(ml, 4, dense_first) makes every fourth layer full, the first among them) and no router soft
cap, so the checkpoints here have the kinds that pattern gives and no soft cap.
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
from tests.gguf_export import add_padded_vocab, add_yarn_keys, config_differences
from tests.parity import assert_parity, convert_and_load
from tests.test_ftw_convert import assert_round_trip
from tests.test_ftw_gguf_hf import _gguf_name, add_stacked_experts, collect_expert, write_gguf
from tests.test_parity import PROMPT, STEPS, hf_model

pytest.importorskip("transformers")

# laguna.cpp's names for what gguf 0.19's qwen3moe/deepseek2 tables do not map (after "model.layers.N.")
OWN_NAMES = {"self_attn.g_proj.weight": "attn_gate.weight", "mlp.experts.e_score_correction_bias": "exp_probs_b.bias",
             **{f"mlp.shared_expert.{p}_proj.weight": f"ffn_{p}_shexp.weight" for p in ("gate", "up", "down")}}


def save_laguna(out: Path, monkeypatch: pytest.MonkeyPatch, **overrides) -> Path:
    """The parity test's laguna checkpoint (4, 2 and 8 query heads, a dense first layer, a routed scale, a
    shared MLP, random q/k norms and bias) with the layer kinds llama.cpp's period gives (full, sliding,
    sliding: a window of 5, whole heads at base 1000; the full layer half of each head at 50000), no router
    soft cap, and `overrides`."""
    config = {**FAMILY_CONFIGS["laguna"], "layer_types": ["full_attention", "sliding_attention", "sliding_attention"],
              "moe_router_logit_softcapping": 0.0, **overrides}
    monkeypatch.setitem(FAMILY_CONFIGS, "laguna", config)
    return save_checkpoint("laguna", out, seed=1)


def export_laguna_gguf(src: Path, out: Path, *, norm: bool = True) -> Path:
    """The file LagunaModel writes from `src`; `norm`, expert_weights_norm (the converter's is always true)."""
    c = json.loads((src / "config.json").read_text())
    layers, rope, head_dim = c["num_hidden_layers"], c["rope_parameters"], c["head_dim"]
    full, swa = rope.get("full_attention", rope), rope.get("sliding_attention")
    w = gguf.GGUFWriter(out, "laguna")
    w.add_block_count(layers)  # (the base's keys)
    w.add_context_length(c["max_position_embeddings"])
    w.add_embedding_length(c["hidden_size"])
    w.add_feed_forward_length(c["intermediate_size"])
    w.add_head_count_kv(c["num_key_value_heads"])
    if full.get("rope_type") == "yarn":
        add_yarn_keys(w, full)
    w.add_rope_freq_base(full["rope_theta"])
    if swa is not None:
        w.add_rope_freq_base_swa(swa["rope_theta"])
    w.add_layer_norm_rms_eps(c["rms_norm_eps"])
    w.add_expert_count(c["num_experts"])
    w.add_expert_used_count(c["num_experts_per_tok"])
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_vocab_size(c["vocab_size"])  # (LagunaModel's)
    w.add_head_count(c.get("num_attention_heads_per_layer") or [c["num_attention_heads"]] * layers)
    if c.get("sliding_window"):
        w.add_sliding_window(c["sliding_window"])
    w.add_expert_feed_forward_length(c["moe_intermediate_size"])
    w.add_expert_shared_feed_forward_length(c["shared_expert_intermediate_size"])
    w.add_expert_weights_norm(norm)
    w.add_expert_weights_scale(float(c["moe_routed_scaling_factor"]))
    w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
    w.add_leading_dense_block_count(next((i for i, t in enumerate(c["mlp_layer_types"]) if t != "dense"), layers))
    w.add_rope_dimension_count(int(head_dim * float(full.get("partial_rotary_factor", 1.0))))
    if swa is not None:
        w.add_rope_dimension_count_swa(int(head_dim * float(swa.get("partial_rotary_factor", 1.0))))
    add_padded_vocab(w, c["vocab_size"], "laguna", bos=c.get("bos_token_id"), eos=c.get("eos_token_id"))
    maps = [gguf.get_tensor_name_map(a, layers) for a in (MODEL_ARCH.QWEN3MOE, MODEL_ARCH.DEEPSEEK2)]
    experts: dict = {}
    for name, t in load_all(src).items():
        if ".mlp.experts." in name and not name.endswith("e_score_correction_bias"):
            collect_expert(experts, name, t.float())
            continue
        parts = name.split(".")
        own = OWN_NAMES.get(".".join(parts[3:])) if name.startswith("model.layers.") else None
        w.add_tensor(f"blk.{parts[2]}.{own}" if own else _gguf_name(maps, name), t.float().contiguous().numpy())
    add_stacked_experts(w, maps, experts)
    return write_gguf(w, out)


def test_laguna_gguf_generates_what_transformers_does(tmp_path: Path, monkeypatch) -> None:
    src = save_laguna(tmp_path / "hf", monkeypatch)
    ours = convert_and_load(export_laguna_gguf(src, tmp_path / "model.gguf"), tmp_path / "store")
    assert ours.config.get("layer_types") == ["full_attention", "sliding_attention", "sliding_attention"]
    assert_parity(ours, hf_model(src), PROMPT, STEPS)


def test_laguna_gguf_without_a_window_per_element_generates_what_transformers_does(tmp_path: Path,
                                                                                   monkeypatch) -> None:
    """Laguna-M.1's kind: no sliding window (every layer full, no _swa keys) and a gate per channel, which
    llama.cpp tells from attn_gate's rows."""
    rope = {"full_attention": FAMILY_CONFIGS["laguna"]["rope_parameters"]["full_attention"]}
    src = save_laguna(tmp_path / "hf", monkeypatch, sliding_window=0, layer_types=["full_attention"] * 3,
                      gating="per-element", rope_parameters=rope)
    ours = convert_and_load(export_laguna_gguf(src, tmp_path / "model.gguf"), tmp_path / "store")
    assert ours.config.get("gating") == "per-element"
    assert_parity(ours, hf_model(src), PROMPT, STEPS)


def test_laguna_gguf_with_yarn_on_the_full_layers_generates_what_transformers_does(tmp_path: Path,
                                                                                   monkeypatch) -> None:
    """YaRN on the full layers (the base's keys from rope_parameters' full_attention), plain RoPE on the
    sliding ones, as laguna.cpp runs them."""
    rope = dict(FAMILY_CONFIGS["laguna"]["rope_parameters"])
    rope["full_attention"] = {**rope["full_attention"], "rope_type": "yarn", "factor": 4.0,
                              "original_max_position_embeddings": 8, "beta_fast": 32.0, "beta_slow": 1.0}
    src = save_laguna(tmp_path / "hf", monkeypatch, rope_parameters=rope)
    ours = convert_and_load(export_laguna_gguf(src, tmp_path / "model.gguf"), tmp_path / "store")
    assert_parity(ours, hf_model(src), PROMPT, STEPS)


def test_laguna_gguf_config_is_the_checkpoints(tmp_path: Path, monkeypatch) -> None:
    """The FTW config and tensors from the GGUF are the HF path's (heads by layer, the layer kinds, each kind's
    rope, the gate, the shared MLP, the bias), the source config the checkpoint's; every tensor back bit for
    bit; routed weights not renormalized are refused by name."""
    src = save_laguna(tmp_path / "hf", monkeypatch)
    direct = convert_checkpoint(src, tmp_path / "ftw-hf")
    index = convert_gguf(export_laguna_gguf(src, tmp_path / "model.gguf"), tmp_path / "ftw")
    assert index.family == direct.family == "laguna"
    assert index.config == direct.config
    assert config_differences(index.source_config, json.loads((src / "config.json").read_text())) == {}
    assert {t.name for t in index.tensors} == {t.name for t in direct.tensors}
    assert_round_trip(src, tmp_path / "ftw")
    with pytest.raises(UnsupportedArchitectureError, match="without expert_weights_norm"):
        convert_gguf(export_laguna_gguf(src, tmp_path / "raw.gguf", norm=False), tmp_path / "ftw-raw")
