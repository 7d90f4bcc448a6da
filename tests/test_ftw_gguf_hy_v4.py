"""Tencent Hy4 (hy_v4) as a GGUF file (`hy_v4`), written the way llama.cpp's converter writes it
(conversion/hy_v4.py:24 at llama.cpp 0c1e570: HYV4Model over DeepseekV2Model), pulled through ft and run against
transformers.

The converter reads the release's names (hc_attn_layer.hc_pre.hc_fn, hc_head.hc_head_fn, self_attn.linear_gate,
learnable_sink_param; the MLPs' gate_proj), not what transformers' save_pretrained writes back through its
conversion_mapping (hc_pre.hc_attn_layer.hc_fn, model.hc_pre.hc_head.hc_head_fn, mlp.linear_gate: the renames
do not invert): `to_release` lays the checkpoint out as the release. `export_hy_v4_gguf` follows the converter:
the base keys (expert_group_count/_used_count unless n_group and topk_group are both 1, which HYV4Model drops),
DeepseekV2Model's (head_count_kv 1, leading_dense_block_count from mlp_layer_types' leading dense run, the LoRA
ranks, the MLA lengths, expert widths and counts, expert_weights_scale and _norm, rope.dimension_count), then
HYV4Model's: expert_gating_func sigmoid, swiglu_clamp_exp one a layer, hyper_connection.count, epsilon and
magnitude, the indexer's head count, key length, top-k and types (one bool a layer); kv_b_proj split into
attn_k_b (transposed per head) and attn_v_b, the fused gate_up_proj split gate first into ffn_gate_exps and
ffn_up_exps, the correction bias renamed (ModelBase.filter_tensors); the vocabulary byte-level with pre "hy_v4"
(get_vocab_base_pre's name for Hy4's). gguf 0.19 has no hy_v4: glm-dsa's table names the tensors the two share,
llama-arch.cpp's names the rest (attn_sinks, attn_gate, hc_attn_*/hc_ffn_*, output_hc_*).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import gguf
import pytest
from gguf.constants import MODEL_ARCH

from ftw import convert_checkpoint
from ftw.errors import UnsupportedArchitectureError
from ftw.gguf_convert import convert_gguf
from tests.checkpoints import FAMILY_CONFIGS, load_all, save_checkpoint
from tests.gguf_export import (
    add_arch_keys,
    add_base_keys,
    add_deepseek2_keys,
    add_padded_vocab,
    add_yarn_keys,
    assert_same_ftw,
    config_differences,
)
from tests.parity import assert_parity, convert_and_load
from tests.test_ftw_gguf_hf import _gguf_name, write_gguf
from tests.test_parity import PROMPT, STEPS, hf_model

pytest.importorskip("transformers")

# YaRN without mscale_all_dim (what llama.cpp's hy_v4 runs as transformers does): 4 times 64 positions
YARN = dict(rope_type="yarn", rope_theta=10000.0, factor=4.0, original_max_position_embeddings=64, beta_fast=32.0,
            beta_slow=1.0)

# the release's names (transformers' save_pretrained -> the release), in order
TO_RELEASE = ((r"^model\.hc_pre\.hc_head\.", "model.hc_head."),
              (r"\.hc_pre\.(hc_attn_layer|hc_mlp_layer)\.hc_(fn|base|scale)$", r".\1.hc_pre.hc_\2"),
              (r"\.mlp\.(shared_experts\.)?linear_gate\.", r".mlp.\1gate_proj."))
# HYV4Model.modify_tensors' names past glm-dsa's table, with llama-arch.cpp's GGUF names
ROOT = {f"model.hc_head.hc_head_{p}": f"output_hc_{p}.weight" for p in ("fn", "base", "scale")}
LAYER = {"self_attn.learnable_sink_param": "attn_sinks.weight", "self_attn.linear_gate.weight": "attn_gate.weight",
         **{f"hc_{kind}_layer.hc_pre.hc_{p}": f"hc_{short}_{p}.weight"
            for kind, short in (("attn", "attn"), ("mlp", "ffn")) for p in ("fn", "base", "scale")}}


def save_hy_v4(out: Path, monkeypatch: pytest.MonkeyPatch, *, seed: int = 1, **overrides) -> Path:
    """The parity test's hy_v4 checkpoint (4 layers, indexers on 0 and 2 keeping 6 tokens, 3 streams, a dense
    first layer, two groups of four experts keeping one, clamped at 1.0) with `overrides`, as save_pretrained
    writes it."""
    monkeypatch.setitem(FAMILY_CONFIGS, "hy_v4", {**FAMILY_CONFIGS["hy_v4"], **overrides})
    return save_checkpoint("hy_v4", out, seed=seed)


def to_release(src: Path, out: Path) -> Path:
    """The checkpoint under the release's tensor names (TO_RELEASE), its config as saved."""
    from safetensors.torch import save_file

    out.mkdir(parents=True)
    tensors = {}
    for name, t in load_all(src).items():
        for pattern, replacement in TO_RELEASE:
            name = re.sub(pattern, replacement, name)
        tensors[name] = t
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text((src / "config.json").read_text())
    return out


def export_hy_v4_gguf(release: Path, out: Path, *, keys: dict | None = None) -> Path:
    """The file HYV4Model writes from the release directory; `keys`, HYV4Model's own metadata to write in place
    of its own (None: left out; a list of floats or bools as an array, a bool, float or int as such)."""
    c = json.loads((release / "config.json").read_text())
    layers, heads, nope, v_dim = c["num_hidden_layers"], c["num_attention_heads"], c["qk_nope_head_dim"], c["v_head_dim"]
    if c.get("n_group") == 1 and c.get("topk_group") == 1:  # (set_gguf_parameters: no group routing)
        c = {k: v for k, v in c.items() if k not in ("n_group", "topk_group")}
    types = c["mlp_layer_types"]
    lead = next((i for i, t in enumerate(types) if t != "dense"), len(types))
    w = gguf.GGUFWriter(out, "hy_v4")
    add_base_keys(w, {**c, "num_key_value_heads": 1})  # (DeepseekV2Model: MLA as MQA)
    rope = c.get("rope_parameters") or {}
    if rope.get("rope_type") == "yarn":
        add_yarn_keys(w, rope)
        if rope.get("mscale_all_dim") is not None:
            w.add_rope_scaling_yarn_log_mul(0.1 * rope["mscale_all_dim"])
    add_deepseek2_keys(w, {**c, "first_k_dense_replace": lead})
    own: dict = {"expert_gating_func": 2, "swiglu_clamp_exp": [float(c["swiglu_limit"])] * layers,
                 "hyper_connection.count": c["hc_mult"], "hyper_connection.epsilon": float(c["hc_eps"]),
                 "hyper_connection.magnitude": float(c["hc_magnitude"]),
                 "attention.indexer.head_count": c["index_n_heads"], "attention.indexer.key_length": c["index_head_dim"],
                 "attention.indexer.top_k": c["index_topk"],
                 "attention.indexer.types": [t == "full" for t in c["indexer_types"]]}
    add_arch_keys(w, "hy_v4", {**own, **(keys or {})})
    add_padded_vocab(w, c["vocab_size"], "hy_v4", bos=c["bos_token_id"], eos=c["eos_token_id"])
    maps = [gguf.get_tensor_name_map(MODEL_ARCH.GLM_DSA, layers)]
    for name, t in load_all(release).items():
        m = re.match(r"model\.layers\.(\d+)\.(.+)$", name)
        if m and m[2] == "mlp.experts.gate_up_proj":  # (split_gate_up: gate rows first)
            gate, up = t.split(c["moe_intermediate_size"], dim=1)
            w.add_tensor(f"blk.{m[1]}.ffn_gate_exps.weight", gate.contiguous().numpy())
            w.add_tensor(f"blk.{m[1]}.ffn_up_exps.weight", up.contiguous().numpy())
        elif m and m[2] == "mlp.experts.down_proj":
            w.add_tensor(f"blk.{m[1]}.ffn_down_exps.weight", t.contiguous().numpy())
        elif m and m[2] == "self_attn.kv_b_proj.weight":  # (DeepseekV2Model.modify_tensors)
            k_b, v_b = t.view(heads, nope + v_dim, t.shape[-1]).split([nope, v_dim], dim=1)
            w.add_tensor(f"blk.{m[1]}.attn_k_b.weight", k_b.transpose(1, 2).contiguous().numpy())
            w.add_tensor(f"blk.{m[1]}.attn_v_b.weight", v_b.contiguous().numpy())
        elif m and m[2] in LAYER:
            w.add_tensor(f"blk.{m[1]}.{LAYER[m[2]]}", t.contiguous().numpy())
        elif name in ROOT:
            w.add_tensor(ROOT[name], t.contiguous().numpy())
        else:
            name = name.replace("e_score_correction_bias", "e_score_correction.bias")  # (ModelBase.filter_tensors)
            w.add_tensor(_gguf_name(maps, name), t.contiguous().numpy())
    return write_gguf(w, out)


@pytest.mark.parametrize("rope", ["plain", "yarn"])
def test_hy_v4_gguf_generates_what_transformers_does(tmp_path: Path, monkeypatch, rope: str) -> None:
    """The parity checkpoint (two groups of experts), and with YaRN one whose n_group and topk_group are both 1
    (keys the converter leaves out)."""
    overrides = dict(rope_parameters=YARN, max_position_embeddings=256, n_group=1, topk_group=1) if rope == "yarn" else {}
    src = save_hy_v4(tmp_path / "hf", monkeypatch, **overrides)
    ours = convert_and_load(export_hy_v4_gguf(to_release(src, tmp_path / "release"), tmp_path / "model.gguf"),
                            tmp_path / "store")
    with ours.registered.open_ftw() as reader:
        bank = reader.index.banks[0]
        assert (bank.activation.kind, bank.activation.limit) == ("swiglu_limited", 1.0)
    assert [b.mixer.indexer is not None for b in ours.model.blocks] == [True, False, True, False]
    assert_parity(ours, hf_model(src), PROMPT, STEPS)


def test_hy_v4_gguf_config_and_tensors_are_the_releases(tmp_path: Path, monkeypatch) -> None:
    """The FTW config and source config from the GGUF are the HF path's from the same release, every dense
    tensor (kv_b_proj rebuilt from its halves) and every expert bank (gate and up fused again) bit for bit."""
    release = to_release(save_hy_v4(tmp_path / "hf", monkeypatch, rope_parameters=YARN), tmp_path / "release")
    direct = convert_checkpoint(release, tmp_path / "ftw-hf")
    index = convert_gguf(export_hy_v4_gguf(release, tmp_path / "model.gguf"), tmp_path / "ftw")
    assert index.family == direct.family == "hy_v4"
    assert index.config == direct.config
    assert config_differences(index.source_config, json.loads((release / "config.json").read_text())) == {}
    assert_same_ftw(tmp_path / "ftw", tmp_path / "ftw-hf")


def test_hy_v4_gguf_refusals(tmp_path: Path, monkeypatch) -> None:
    """What llama.cpp runs and Hy4 cannot, refused by name: another gating function, no DSA indexer (full
    attention), routed experts unclamped or clamped by layer, a clamp on the shared experts, a first layer
    sharing a selection, and YaRN with a yarn_log_multiplier (llama.cpp ignores it; transformers would fold
    mscale_all_dim into the softmax)."""
    release = to_release(save_hy_v4(tmp_path / "hf", monkeypatch), tmp_path / "release")
    for keys, match in (({"expert_gating_func": 1}, "routes by sigmoid"),
                        ({"attention.indexer.top_k": None, "attention.indexer.types": None}, "without a DSA indexer"),
                        ({"swiglu_clamp_exp": None}, "swiglu_clamp_exp None"),
                        ({"swiglu_clamp_exp": [1.0, 1.0, 1.0, 2.0]}, "one positive swiglu_limit"),
                        ({"swiglu_clamp_shexp": [1.0] * 4}, "routed experts only"),
                        ({"attention.indexer.types": [False, True, True, False]}, "first layer shares")):
        name = re.sub(r"\W", "_", str(keys))[:40]
        with pytest.raises(UnsupportedArchitectureError, match=match):
            convert_gguf(export_hy_v4_gguf(release, tmp_path / f"{name}.gguf", keys=keys), tmp_path / f"ftw-{name}")
    yarn = to_release(save_hy_v4(tmp_path / "hf-yarn", monkeypatch, rope_parameters={**YARN, "mscale_all_dim": 1.0},
                                 max_position_embeddings=256), tmp_path / "release-yarn")
    with pytest.raises(UnsupportedArchitectureError, match="yarn_log_multiplier"):
        convert_gguf(export_hy_v4_gguf(yarn, tmp_path / "yarn.gguf"), tmp_path / "ftw-yarn")
