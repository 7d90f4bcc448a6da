"""HF checkpoint -> FTW round trips: every source tensor comes back bit for bit."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch

from ftw import FTWReader, SourceError, UnsupportedArchitectureError, convert_checkpoint, family_for_config
from ftw.format import ALIGNMENT
from tests.checkpoints import FAMILIES, load_all, save_checkpoint, to_fp8

# Written independently of ftw/families.py: how each on-disk name maps into the expert record.
PER_EXPERT = re.compile(
    r"layers\.(\d+)\.(?:mlp|block_sparse_moe|feed_forward|mixer)\.experts\.(\d+)\.(gate_proj|up_proj|down_proj|w1|w3|w2)\."
    r"(weight|weight_scale_inv)$"
)
# (Gemma 4's beside the dense MLP, under the layer itself: model.layers.3.experts.gate_up_proj)
FUSED = re.compile(r"layers\.(\d+)\.(?:mlp\.|block_sparse_moe\.)?experts\.(gate_up_proj|down_proj)$")
# (Nemotron-H's, not gated: up_proj [E, I, H] is all of w13)
NEMOTRON_H_FUSED = re.compile(r"layers\.(\d+)\.mixer\.experts\.(up_proj|down_proj)$")
# Granite's (and JetMoE's MLP) fused names: input_linear is gate_up_proj [E, 2I, H] (gate rows first),
# output_linear down_proj; JetMoE's attention experts (self_attention.experts.) stay dense
GRANITE_FUSED = re.compile(r"layers\.(\d+)\.(?:block_sparse_moe|mlp)\.(input_linear|output_linear)\.weight$")
# LFM2-MoE's, under feed_forward but laid out as FUSED (not under language_model.: Llama 4's)
LFM2_FUSED = re.compile(r"^model\.layers\.(\d+)\.feed_forward\.experts\.(gate_up_proj|down_proj)$")
# Llama 4's: gate_up_proj [E, H, 2I] (gate columns first) and down_proj [E, I, H], each expert's the transpose
LLAMA4_FUSED = re.compile(r"layers\.(\d+)\.feed_forward\.experts\.(gate_up_proj|down_proj)$")
# Ergo's, not gated, [E, in, out] either way: up_proj [E, H, I] (all of w13) and down_proj [E, I, H], each
# expert's the transpose (the release's under feed_forward); the release's router and shared expert [in, out]
ERGO_FUSED = re.compile(r"layers\.(\d+)\.(?:feed_forward|mlp\.experts)\.(up_proj|down_proj)$")
ERGO_TRANSPOSED = re.compile(r"\.feed_forward\.(?:gate_kernel|shared_up_proj|shared_down_proj)$")
# Doge's experts, an embedding row each: down_embed [E, H] (each expert's w13, one row) and up_embed [E, H] (its w2,
# one column)
DOGE_EMBEDS = re.compile(r"layers\.(\d+)\.mlp\.(down_embed|up_embed)\.weight$")
# DBRX's: w1 (gate), v1 (up) and w2 (down), each [E * I, H]: an expert's rows of w2 are its down's transpose
DBRX_FLAT = re.compile(r"blocks\.(\d+)\.ffn\.experts\.mlp\.(w1|v1|w2)$")
# gpt-oss's: gate_up_proj [E, H, 2I] (gate and up columns alternating) and down_proj [E, I, H], each
# expert's the transpose, whatever their shapes; their biases [E, 2I] (alternating) and [E, H]
GPT_OSS_FUSED = re.compile(r"layers\.(\d+)\.mlp\.experts\.(gate_up_proj|down_proj)(_bias)?$")
# the release names a family's converter renames to transformers' (MiMo-V2-Flash's sinks, Laguna's
# correction bias and shared MLP, Kimi Linear's and Ling's forget gates, MoE, embeddings and output),
# each the part of a name and what it becomes, in turn
RENAMED = {"mimo_v2_flash": {".self_attn.attention_sink_bias": ".self_attn.sinks"},
           "nemotron_h": {"backbone.": "model.", "model.embeddings.": "model.embed_tokens.", "model.norm_f.": "model.norm."},
           "laguna": {".mlp.experts.e_score_correction_bias": ".mlp.gate.e_score_correction_bias",
                      ".mlp.shared_expert.": ".mlp.shared_experts."},
           "kimi_linear": {".self_attn.f_a_proj.": ".self_attn.forget_gate.f_a_proj.",
                           ".self_attn.f_b_proj.": ".self_attn.forget_gate.f_b_proj.",
                           ".self_attn.dt_bias": ".self_attn.forget_gate.dt_bias",
                           ".self_attn.A_log": ".self_attn.forget_gate.A_log", ".block_sparse_moe.": ".mlp."},
           "bailing_hybrid": {"model.word_embeddings.": "model.embed_tokens.", ".attention.": ".self_attn.",
                              ".self_attn.f_proj.": ".self_attn.forget_gate.f_proj.",
                              ".self_attn.dt_bias": ".self_attn.forget_gate.dt_bias",
                              ".self_attn.A_log": ".self_attn.forget_gate.A_log",
                              ".self_attn.dense.": ".self_attn.o_proj.",
                              ".mlp.gate.expert_bias": ".mlp.gate.e_score_correction_bias"},
           # (a mistral3 checkpoint's text model: the original format's names, then transformers' own)
           "mistral4": {"language_model.model.": "model.", "language_model.lm_head.": "lm_head.",
                        "model.language_model.": "model."},
           "gemma4_text": {"model.language_model.": "model."},  # (a gemma4 checkpoint's text model)
           "axk1": {".post_mlp_layernorm.": ".mlp.post_mlp_layernorm."},  # (the release's place, beside the layer's norms)
           "flint": {".self_attn.softmax_offset": ".self_attn.sinks"},  # (the release's name of the sinks)
           "lara_mini": {".linear_attn.out_norm.": ".linear_attn.norm."},  # (the release's name of the gated norm)
           "kolibri1": {".moe.router.expert_bias": ".mlp.gate.e_score_correction_bias",
                        ".post_attn_norm.": ".post_self_attn_layernorm.", ".post_ffn_norm.": ".post_mlp_layernorm."},
           # (the release's query-and-gate projection and gated norms' MLP)
           "axk2": {".self_attn.q_b_proj.": ".self_attn.q_gate_proj.", "_layernorm.W_down.": "_layernorm.mlp.fc1.",
                    "_layernorm.W_up.": "_layernorm.mlp.fc2."},
           # (the release's hyper-connections under hc_pre., linear_gate and learnable_sink_param)
           "hy_v4": {".hc_pre.hc_attn_layer.hc_": ".attn_hc.", ".hc_pre.hc_mlp_layer.hc_": ".ffn_hc.",
                     ".hc_pre.hc_head.hc_head_": ".hc_head.hc_", ".learnable_sink_param": ".sinks",
                     ".linear_gate.": ".gate_proj."},
           "hy_v3": {".mlp.router.gate.": ".mlp.gate.", ".mlp.expert_bias": ".mlp.e_score_correction_bias",
                     ".mlp.shared_mlp.": ".mlp.shared_experts."},
           # (query_key_value stays fused: the runtime reads it apart)
           "sarvam_moe": {"model.word_embeddings.": "model.embed_tokens.", ".attention.": ".self_attn.",
                          ".self_attn.dense.": ".self_attn.o_proj.", ".self_attn.query_layernorm.": ".self_attn.q_norm.",
                          ".self_attn.key_layernorm.": ".self_attn.k_norm.",
                          ".mlp.gate.expert_bias": ".mlp.gate.e_score_correction_bias"}}
HALF = {"gate_proj": 0, "w1": 0, "up_proj": 1, "w3": 1}
SCALE_PART = {"gate_proj": "w1_scale", "w1": "w1_scale", "up_proj": "w3_scale", "w3": "w3_scale",
              "down_proj": "w2_scale", "w2": "w2_scale"}


def assert_round_trip(src: Path, out: Path) -> FTWReader:
    source = load_all(src)
    reader = FTWReader.open(out)
    index = reader.index
    banks = {b.layer: (b, reader.bank_bytes(b.layer)) for b in index.banks}
    dense_names = {t.name for t in index.tensors}
    seen = 0
    for name, want in source.items():
        renamed = name
        for old, new in RENAMED.get(index.family, {}).items():
            renamed = renamed.replace(old, new)
        if index.family == "ergo":  # (its release renames a name's every part, anchored: the family's own table)
            renamed = family_for_config({"model_type": "ergo"}).tensor_name(name)
        if renamed in dense_names:
            got = reader.tensor(renamed)
            if index.family == "ergo" and ERGO_TRANSPOSED.search(name):
                got = got.T.contiguous()
        elif index.family == "ergo" and (m := ERGO_FUSED.search(name)):
            bank, data = banks[int(m[1])]
            part = "w13" if m[2] == "up_proj" else "w2"
            got = torch.stack([reader.expert_part(data, bank, e, part).T for e in range(bank.num_experts)])
        elif m := PER_EXPERT.search(name):
            layer, expert, proj, what = int(m[1]), int(m[2]), m[3], m[4]
            bank, data = banks[layer]
            if what == "weight_scale_inv":
                got = reader.expert_part(data, bank, expert, SCALE_PART[proj])
            elif proj in HALF and not bank.activation.gated:  # (w13 is up_proj alone)
                got = reader.expert_part(data, bank, expert, "w13")
            elif proj in HALF:
                w13 = reader.expert_part(data, bank, expert, "w13")
                half = w13.shape[0] // 2
                got = w13[:half] if HALF[proj] == 0 else w13[half:]
            else:
                got = reader.expert_part(data, bank, expert, "w2")
        elif index.family == "doge" and (m := DOGE_EMBEDS.search(name)):
            bank, data = banks[int(m[1])]
            part = "w13" if m[2] == "down_embed" else "w2"
            got = torch.stack([reader.expert_part(data, bank, e, part).reshape(-1) for e in range(bank.num_experts)])
        elif index.family == "gpt_oss" and (m := GPT_OSS_FUSED.search(name)):
            bank, data = banks[int(m[1])]
            part = ("w13" if m[2] == "gate_up_proj" else "w2") + (m[3] or "")
            parts = [reader.expert_part(data, bank, e, part) for e in range(bank.num_experts)]
            if part.startswith("w13"):  # FTW's gate rows, then up: alternated back
                parts = [torch.stack(p.chunk(2), dim=1).reshape(p.shape) for p in parts]
            got = torch.stack([p.T if p.dim() == 2 else p for p in parts])
        elif m := FUSED.search(name) or GRANITE_FUSED.search(name) or LFM2_FUSED.search(name) or NEMOTRON_H_FUSED.search(name):
            bank, data = banks[int(m[1])]
            part = "w13" if m[2] in ("gate_up_proj", "input_linear", "up_proj") else "w2"
            got = torch.stack([reader.expert_part(data, bank, e, part) for e in range(bank.num_experts)])
        elif m := LLAMA4_FUSED.search(name):
            bank, data = banks[int(m[1])]
            part = "w13" if m[2] == "gate_up_proj" else "w2"
            got = torch.stack([reader.expert_part(data, bank, e, part).T for e in range(bank.num_experts)])
        elif m := DBRX_FLAT.search(name):
            bank, data = banks[int(m[1])]
            experts = range(bank.num_experts)
            if m[2] == "w2":
                got = torch.cat([reader.expert_part(data, bank, e, "w2").T for e in experts])
            else:
                w13 = [reader.expert_part(data, bank, e, "w13") for e in experts]
                got = torch.cat([w.chunk(2)[0 if m[2] == "w1" else 1] for w in w13])
        else:
            assert name.startswith(("model.visual.", "mtp.", "vision_model.", "multi_modal_projector.", "vision_tower.",
                                    "model.vision_tower.", "model.multi_modal_projector.", "model.embed_vision.")), \
                f"{name} was dropped"
            continue
        assert got.dtype == want.dtype and got.shape == want.shape, name
        assert torch.equal(got.view(torch.uint8), want.contiguous().view(torch.uint8)), name
        seen += 1
    assert seen > 0
    return reader


@pytest.mark.parametrize("family", FAMILIES)
def test_round_trip_per_expert_layout(family: str, tmp_path: Path) -> None:
    src = save_checkpoint(family, tmp_path / "hf")
    index = convert_checkpoint(src, tmp_path / "ftw")
    reader = assert_round_trip(src, tmp_path / "ftw")
    config = json.loads((src / "config.json").read_text())
    assert index.family == family
    assert index.config["num_experts"] == reader.index.banks[0].num_experts
    assert [b.layer for b in index.banks] == index.config["moe_layers"]
    assert index.source_config == config
    reader.verify()


@pytest.mark.parametrize("family", ["qwen3_moe", "qwen3_5_moe", "qwen4_exp", "deepseek_v3", "granitemoe", "phimoe", "lfm2_moe", "jamba",
                                    "mistral4", "nemotron_h", "longcat_flash", "flint", "kolibri1", "axk2", "beam",
                                    "ergo", "hy_v4", "zaya", "lara_mini"])
def test_round_trip_fused_layout(family: str, tmp_path: Path) -> None:
    if family == "ergo":  # (not gated; transformers' own names, its router and shared expert [out, in])
        src = save_checkpoint(family, tmp_path / "hf", fused=True)
        assert any(n.endswith(".mlp.experts.up_proj") for n in load_all(src))
        index = convert_checkpoint(src, tmp_path / "ftw")
        assert index.banks[0].activation.kind == "relu2" and index.banks[0].part("w13").shape == (32, 64)
        assert_round_trip(src, tmp_path / "ftw")
        return
    if family == "nemotron_h":  # (not gated: its fused experts are up_proj and down_proj)
        src = save_checkpoint(family, tmp_path / "hf", fused=True)
        assert any(n.endswith(".mixer.experts.up_proj") for n in load_all(src))
        index = convert_checkpoint(src, tmp_path / "ftw")
        assert index.banks[0].activation.kind == "relu2" and index.banks[0].part("w13").shape == (32, 64)
        assert_round_trip(src, tmp_path / "ftw")
        return
    src = save_checkpoint(family, tmp_path / "hf", fused=True)
    assert any(".experts.gate_up_proj" in n for n in load_all(src)), "transformers no longer writes the fused layout"
    convert_checkpoint(src, tmp_path / "ftw")
    assert_round_trip(src, tmp_path / "ftw")


@pytest.mark.parametrize("family", ["deepseek_v3", "qwen3_moe"])
def test_round_trip_fp8_block_scaled(family: str, tmp_path: Path) -> None:
    src = to_fp8(save_checkpoint(family, tmp_path / "hf"), tmp_path / "fp8")
    index = convert_checkpoint(src, tmp_path / "ftw")
    assert index.banks[0].part("w13").dtype == "f8_e4m3"
    assert index.banks[0].quant["fp8_block"] == [128, 128]
    assert {p.name for p in index.banks[0].parts} == {"w13", "w2", "w1_scale", "w3_scale", "w2_scale"}
    assert_round_trip(src, tmp_path / "ftw")
    with pytest.raises(SourceError, match="FP8"):
        convert_checkpoint(src, tmp_path / "bf16", dtype="bf16")


def test_mistral3_around_a_dense_text_model_is_refused_by_name(tmp_path: Path) -> None:
    """`mistral3` is Mistral Small 4's released type (around mistral4) and Mistral Small 3.x's (around
    the dense 'mistral'): the text config decides, and the dense one is refused before any download."""
    src = save_checkpoint("mistral4", tmp_path / "hf")
    config = json.loads((src / "config.json").read_text())
    assert config["model_type"] == "mistral3" and family_for_config(config).name == "mistral4"
    config["text_config"] = {**config["text_config"], "model_type": "mistral"}
    with pytest.raises(UnsupportedArchitectureError, match="'mistral' text model.*mistral3 around mistral4"):
        family_for_config(config)
    (src / "config.json").write_text(json.dumps(config))
    with pytest.raises(UnsupportedArchitectureError, match="dense"):
        convert_checkpoint(src, tmp_path / "ftw")


def test_dense_gemma4_is_refused_by_name_and_the_moe_one_keeps_its_geglu_experts(tmp_path: Path) -> None:
    """gemma4_text is the text model of Gemma 4's dense releases (E2B, E4B, 31B) and of its MoE one
    (26B-A4B): a config without the MoE block is refused before any download, wrapped or not; the
    MoE one's banks say their experts are GELU-gated."""
    src = save_checkpoint("gemma4_text", tmp_path / "hf")
    config = json.loads((src / "config.json").read_text())
    assert config["model_type"] == "gemma4" and family_for_config(config).name == "gemma4_text"
    assert {b.activation.kind for b in convert_checkpoint(src, tmp_path / "ftw").banks} == {"geglu_tanh"}
    dense = {**config["text_config"], "enable_moe_block": False, "num_experts": None}
    for wrapped in ({**config, "text_config": dense}, dense):
        with pytest.raises(UnsupportedArchitectureError, match="no MoE block.*dense Gemma 4.*mixture-of-experts"):
            family_for_config(wrapped)
    (src / "config.json").write_text(json.dumps({**config, "text_config": dense}))
    with pytest.raises(UnsupportedArchitectureError, match="enable_moe_block"):
        convert_checkpoint(src, tmp_path / "dense")


def test_sharded_source_and_output(tmp_path: Path) -> None:
    src = save_checkpoint("mixtral", tmp_path / "hf", max_shard_size="100KB")
    assert (src / "model.safetensors.index.json").exists()
    index = convert_checkpoint(src, tmp_path / "ftw", max_shard_bytes=64 << 10)
    assert len(index.shards) > 2
    assert_round_trip(src, tmp_path / "ftw")


def test_layout_is_aligned_and_experts_contiguous(tmp_path: Path) -> None:
    src = save_checkpoint("qwen3_moe", tmp_path / "hf")
    index = convert_checkpoint(src, tmp_path / "ftw")
    for t in index.tensors:
        assert t.offset % ALIGNMENT == 0
    for b in index.banks:
        assert b.offset % ALIGNMENT == 0 and b.expert_stride % ALIGNMENT == 0
        assert b.nbytes == b.num_experts * b.expert_stride


def test_cast_to_bf16(tmp_path: Path) -> None:
    src = save_checkpoint("qwen3_moe", tmp_path / "hf")
    index = convert_checkpoint(src, tmp_path / "ftw", dtype="bf16")
    reader = FTWReader.open(tmp_path / "ftw")
    source = load_all(src)
    assert index.config["dtype"] == "bf16"
    name = "model.embed_tokens.weight"
    assert torch.equal(reader.tensor(name), source[name].to(torch.bfloat16))
    bank = index.banks[0]
    w2 = reader.expert_part(reader.bank_bytes(bank.layer), bank, 3, "w2")
    assert torch.equal(w2, source[f"model.layers.{bank.layer}.mlp.experts.3.down_proj.weight"].to(torch.bfloat16))


def test_unknown_architecture_lists_supported(tmp_path: Path) -> None:
    src = save_checkpoint("mixtral", tmp_path / "hf")
    config = json.loads((src / "config.json").read_text())
    config["model_type"] = "no_such_moe"
    (src / "config.json").write_text(json.dumps(config))
    from ftw.families import FAMILIES as CONVERTED  # (the list grows with every family added)

    with pytest.raises(UnsupportedArchitectureError, match=re.escape("supported families: " + ", ".join(sorted(CONVERTED)))):
        convert_checkpoint(src, tmp_path / "ftw")


def test_truncated_source_is_refused(tmp_path: Path) -> None:
    src = save_checkpoint("mixtral", tmp_path / "hf")
    path = src / "model.safetensors"
    path.write_bytes(path.read_bytes()[:-1000])
    with pytest.raises(SourceError, match="truncated"):
        convert_checkpoint(src, tmp_path / "ftw")


def test_missing_expert_is_refused(tmp_path: Path) -> None:
    full = save_checkpoint("qwen3_moe", tmp_path / "hf")
    tensors = load_all(full)
    del tensors["model.layers.2.mlp.experts.3.up_proj.weight"]
    partial = tmp_path / "partial"
    partial.mkdir()
    shutil.copy(full / "config.json", partial / "config.json")
    from safetensors.torch import save_file

    save_file(tensors, str(partial / "model.safetensors"))
    with pytest.raises(SourceError, match="layer 2 expert 3: up_proj.weight is missing"):
        convert_checkpoint(partial, tmp_path / "ftw")


def edited_checkpoint(full: Path, tensors: dict[str, torch.Tensor], out: Path) -> Path:
    """`full`'s config.json beside `tensors` as one safetensors file: a checkpoint edited by hand."""
    from safetensors.torch import save_file

    out.mkdir()
    shutil.copy(full / "config.json", out / "config.json")
    save_file(tensors, str(out / "model.safetensors"))
    return out


@pytest.mark.parametrize(("edit", "message"), [
    ("transpose", r"layer 2 expert 3: gate_proj.weight has shape \[\d+, \d+\], not \[\d+, \d+\]"),
    ("extra", r"layer 2: experts \[4\] are beyond the 4 of config.json"),
])
def test_an_expert_that_does_not_match_the_config_is_refused(tmp_path: Path, edit: str, message: str) -> None:
    """An expert tensor of the right size but the wrong shape (a transposed gate) would be
    written as garbage weights; one beyond config.json's count would be dropped in silence."""
    full = save_checkpoint("qwen3_moe", tmp_path / "hf")
    tensors = load_all(full)
    gate = "model.layers.2.mlp.experts.3.gate_proj.weight"  # (4 experts a layer; layer 1 is dense)
    if edit == "transpose":
        tensors[gate] = tensors[gate].t().contiguous()
    else:
        for proj in ("gate_proj", "up_proj", "down_proj"):
            tensors[f"model.layers.2.mlp.experts.4.{proj}.weight"] = tensors[f"model.layers.2.mlp.experts.0.{proj}.weight"].clone()
    with pytest.raises(SourceError, match=message):
        convert_checkpoint(edited_checkpoint(full, tensors, tmp_path / "edited"), tmp_path / "ftw")


@pytest.mark.parametrize(("alias", "message"), [
    ("model.layers.2.mlp.experts.03.gate_proj.weight", "'03' is not a plain decimal index"),
    ("model.layers.\u0662.mlp.experts.3.gate_proj.weight", "matches no known layout"),
    ("model.layers.2.block_sparse_moe.experts.3.w1.weight", "both layer 2's gate_proj of expert 3"),
])
def test_two_names_for_one_expert_tensor_are_refused(tmp_path: Path, alias: str, message: str) -> None:
    """"experts.03" (or a digit of another script, or Mixtral's name beside Qwen's) would stand
    for the same tensor as "experts.3": whichever came last replaced the other in silence."""

    full = save_checkpoint("qwen3_moe", tmp_path / "hf")
    tensors = load_all(full)
    tensors[alias] = torch.zeros_like(tensors["model.layers.2.mlp.experts.3.gate_proj.weight"])
    with pytest.raises(SourceError, match=message):
        convert_checkpoint(edited_checkpoint(full, tensors, tmp_path / "edited"), tmp_path / "ftw")


def test_garbage_header_is_refused(tmp_path: Path) -> None:
    src = save_checkpoint("mixtral", tmp_path / "hf")
    (src / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all}")
    with pytest.raises(SourceError, match="not valid JSON"):
        convert_checkpoint(src, tmp_path / "ftw")


@pytest.mark.parametrize(("edit", "message"), [
    ({"num_hidden_layers": "abc"}, "num_hidden_layers is 'abc', not a whole number from 1 to 4096"),
    ({"num_hidden_layers": 10**12}, "num_hidden_layers is 1000000000000, not a whole number"),
    ({"num_attention_heads": 0, "head_dim": None}, "num_attention_heads is 0, not a whole number"),
    ({"hidden_size": True}, "hidden_size is True, not a whole number"),
    ({"num_experts_per_tok": 99}, "num_experts_per_tok is 99, not a whole number from 1 to 4"),
    ({"mlp_only_layers": [[1]]}, "the MoE layers or shared experts of this qwen3_moe model cannot be read"),
    ({"quantization_config": {"weight_block_size": 128}}, "weight_block_size is 128, not two numbers"),
])
def test_config_sizes_are_checked_before_anything_is_sized_by_them(tmp_path: Path, edit: dict, message: str) -> None:
    """config.json is untrusted: a size that is not a whole number in a real model's range is
    refused, naming the key (a layer count of 10**12 looped and allocated without end, a head
    count of 0 divided by zero, a string raised a bare ValueError)."""
    src = save_checkpoint("qwen3_moe", tmp_path / "hf")
    config = json.loads((src / "config.json").read_text())
    config.update(edit)
    (src / "config.json").write_text(json.dumps({k: v for k, v in config.items() if v is not None}))
    with pytest.raises(SourceError, match=message):
        convert_checkpoint(src, tmp_path / "ftw")


def test_a_config_of_the_wrong_types_is_refused_with_its_own_errors(tmp_path: Path) -> None:
    """1e309 shared experts raised OverflowError; an unknown architecture whose "architectures"
    holds no strings raised TypeError instead of naming the supported families."""
    src = save_checkpoint("qwen3_moe", tmp_path / "hf")
    config = json.loads((src / "config.json").read_text())
    for edit, error, message in (
            ({"model_type": "deepseek_v3", "n_routed_experts": 4, "n_shared_experts": 1e309}, SourceError,
             "shared experts of this deepseek_v3 model cannot be read"),
            ({"rms_norm_eps": float("nan")}, SourceError, "rms_norm_eps is nan, not a finite number above 0"),
            ({"quantization_config": {"quant_method": "compressed-tensors"}}, SourceError,
             "quantized with 'compressed-tensors'; ft converts bf16"),
            ({"rope_theta": -1}, SourceError, "rope_theta is -1, not a finite number above 0"),
            ({"model_type": "llama", "architectures": [1]}, UnsupportedArchitectureError, r"'llama' \(1\)"),
            ({"model_type": "llama", "architectures": 7}, UnsupportedArchitectureError, r"'llama' \(7\)")):
        (src / "config.json").write_text(json.dumps({**config, **edit}))
        with pytest.raises(error, match=message):
            convert_checkpoint(src, tmp_path / "ftw")


@pytest.mark.parametrize(("name", "shape", "message"), [
    ("model.layers.0.input_layernorm.weight", (8,), r"input_layernorm.weight' has shape \[8\], not \[\d+\]"),
    ("model.layers.2.mlp.gate.weight", (3, None), r"mlp.gate.weight' has shape \[3, \d+\], not \[4, \d+\]"),
    ("model.embed_tokens.weight", (None, 7), r"not \[vocabulary, \d+\]"),
    ("model.layers.0.input_layernorm.weight", (0, 2**63), "malformed shape"),
])
def test_dense_tensors_the_config_sizes_are_checked(tmp_path: Path, name: str, shape: tuple, message: str) -> None:
    """A norm of the wrong length converted and failed only at `ft run`; a router a row short ran
    with one expert never chosen; [0, 2**63] holds no bytes and passed until torch was asked."""
    from safetensors.torch import save_file

    full = save_checkpoint("qwen3_moe", tmp_path / "hf")
    tensors = load_all(full)
    edited = tmp_path / "edited"
    edited.mkdir()
    shutil.copy(full / "config.json", edited / "config.json")
    if 2**63 in shape:  # safetensors cannot write it: a hand-made header
        header = json.dumps({name: {"dtype": "F32", "shape": list(shape), "data_offsets": [0, 0]}}).encode()
        save_file({k: v for k, v in tensors.items() if k != name}, str(edited / "model.safetensors"))
        (edited / "extra.safetensors").write_bytes(len(header).to_bytes(8, "little") + header)
    else:
        real = tensors[name].shape
        tensors[name] = torch.zeros(*(r if s is None else s for s, r in zip(shape, real, strict=False)))
        save_file(tensors, str(edited / "model.safetensors"))
    with pytest.raises(SourceError, match=message):
        convert_checkpoint(edited, tmp_path / "ftw")


def test_a_bad_tensor_is_named_with_the_shard_that_holds_it(tmp_path: Path) -> None:
    """A sharded checkpoint (each tensor a file of its own, as hub checkpoints come) whose norm
    in one shard is the wrong length: the error names that file, not the checkpoint's folder."""
    from safetensors.torch import save_file

    full = save_checkpoint("qwen3_moe", tmp_path / "hf")
    tensors = load_all(full)
    edited = tmp_path / "sharded"
    edited.mkdir()
    shutil.copy(full / "config.json", edited / "config.json")
    bad = "model.layers.1.post_attention_layernorm.weight"
    tensors[bad] = torch.zeros(8)
    names = sorted(tensors)
    for i in range(0, len(names), 8):
        save_file({n: tensors[n] for n in names[i:i + 8]}, str(edited / f"model-{i // 8:05d}.safetensors"))
    holder = edited / f"model-{names.index(bad) // 8:05d}.safetensors"
    with pytest.raises(SourceError, match=r"post_attention_layernorm.weight' has shape \[8\]") as e:
        convert_checkpoint(edited, tmp_path / "ftw")
    assert str(e.value).startswith(f"{holder}: ")


NESTED = b"[" * 200_000 + b"]" * 200_000  # small, and deeper than Python's recursion limit


def test_deeply_nested_json_is_refused_as_invalid_not_a_crash(tmp_path: Path) -> None:
    """A header, a config.json or an FTW index nested deeper than the parser can recurse: the
    same clear error as any invalid JSON (a RecursionError escaped before)."""
    src = save_checkpoint("mixtral", tmp_path / "hf")
    weights = (src / "model.safetensors").read_bytes()
    (src / "model.safetensors").write_bytes(len(NESTED).to_bytes(8, "little") + NESTED)
    with pytest.raises(SourceError, match="header is not valid JSON"):
        convert_checkpoint(src, tmp_path / "ftw")
    (src / "model.safetensors").write_bytes(weights)
    (src / "config.json").write_bytes(NESTED)
    with pytest.raises(SourceError, match="config.json is not valid JSON"):
        convert_checkpoint(src, tmp_path / "ftw2")
