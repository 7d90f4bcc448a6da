"""HF checkpoint -> GGUF (as llama.cpp's convert_hf_to_gguf.py writes it) -> FTW gives back the HF tensors.

`export_gguf` is written independently of ftw/gguf_names.py and gguf_source.py: GGUF names come
from gguf-py's own TensorNameMap, and it applies llama.cpp's transformations (expert stacking, the
llama Q/K row permutation, DeepSeek's kv_b split, Granite's gate|up split). Converting its output
with `convert_gguf` must give the HF tensors bit for bit under their HF names, and the same
normalized config as converting the HF checkpoint directly: that checks the name tables, the
transposition conventions and the config.
"""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from gguf.constants import MODEL_ARCH, MODEL_ARCH_NAMES, MODEL_TENSOR, TENSOR_NAMES, GGMLQuantizationType

from ftw import FTWReader, convert_checkpoint
from ftw.gguf_convert import convert_gguf
from tests.checkpoints import load_all, save_checkpoint
from tests.test_ftw_convert import assert_round_trip

ARCH = {"qwen3_moe": MODEL_ARCH.QWEN3MOE, "mixtral": MODEL_ARCH.LLAMA, "deepseek_v3": MODEL_ARCH.DEEPSEEK2,
        "qwen2_moe": MODEL_ARCH.QWEN2MOE, "olmoe": MODEL_ARCH.OLMOE, "glm4_moe": MODEL_ARCH.GLM4_MOE,
        "dots1": MODEL_ARCH.DOTS1, "granitemoe": MODEL_ARCH.GRANITE_MOE, "granitemoeshared": MODEL_ARCH.GRANITE_MOE,
        "ernie4_5_moe": MODEL_ARCH.ERNIE4_5_MOE, "dbrx": MODEL_ARCH.DBRX, "deepseek_v2": MODEL_ARCH.DEEPSEEK2,
        "minimax_m2": MODEL_ARCH.MINIMAXM2}
LLAMA_PERMUTED = ("mixtral", "granitemoe", "granitemoeshared")  # converters derived from LlamaModel


def llama_cpp_permute(w: torch.Tensor, n_head: int, n_head_kv: int | None) -> torch.Tensor:
    """llama.cpp's LlamaModel.permute, verbatim in effect."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _gguf_name(maps: list, hf_name: str) -> str:
    for m in maps:
        name = m.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        if name is not None:
            return name
    raise AssertionError(f"gguf-py has no GGUF name for {hf_name}")


def collect_expert(experts: dict, name: str, t: torch.Tensor) -> None:
    """Keep a per-expert tensor (model.layers.L.<block>.experts.E.proj.weight) for `add_stacked_experts`."""
    parts = name.split(".")
    experts.setdefault((int(parts[2]), ".".join(parts[:5] + parts[6:])), {})[int(parts[5])] = t


def add_stacked_experts(w: gguf.GGUFWriter, maps: list, experts: dict, *, per_expert: bool = False,
                        qtype: GGMLQuantizationType | None = None) -> None:
    """Each layer's collected experts stacked [E, ...] under their GGUF name, as llama.cpp's converters do;
    with `per_expert`, each expert its own tensor blk.N.ffn_{gate,up,down}.E.weight, as llama.cpp's
    convert.py wrote Mixtral before April 2024 (MODEL_TENSOR.FFN_*_EXP); `qtype`, quantized so (each
    expert on its own when per_expert, the stack at once otherwise)."""

    def add(name: str, t: torch.Tensor) -> None:
        array = t.contiguous().numpy()
        if qtype is None:
            w.add_tensor(name, array)
        else:
            w.add_tensor(name, gguf.quants.quantize(array, qtype), raw_dtype=qtype)

    for (_, merged), by_expert in sorted(experts.items()):
        if per_expert:
            fused = _gguf_name(maps, merged)  # blk.N.ffn_gate_exps.weight
            for e in range(len(by_expert)):
                add(fused.replace("_exps.weight", f".{e}.weight"), by_expert[e])
            continue
        add(_gguf_name(maps, merged), torch.stack([by_expert[e] for e in range(len(by_expert))]))


def with_nextn_block(tensors: dict[str, torch.Tensor], c: dict, layers: int) -> dict[str, torch.Tensor]:
    """A checkpoint's tensors with a NextN (MTP) block after its `layers`: the last layer's tensors
    again under the next index, and NextN's own eh_proj and enorm."""
    last = f".layers.{layers - 1}."
    out = tensors | {n.replace(last, f".layers.{layers}."): t for n, t in tensors.items() if last in n}
    out[f"model.layers.{layers}.eh_proj.weight"] = torch.zeros(c["hidden_size"], 2 * c["hidden_size"])
    out[f"model.layers.{layers}.enorm.weight"] = torch.ones(c["hidden_size"])
    return out


def add_deepseek2_tensors(w: gguf.GGUFWriter, maps: list, c: dict, tensors: dict[str, torch.Tensor], *,
                          nextn_layer: int | None = None) -> None:
    """A DeepSeek-V2-style checkpoint's tensors (DeepSeek-V3.2, GLM-4.7-Flash, GLM-5) as llama.cpp's
    converter writes them (DeepseekV2Model.modify_tensors): each layer's experts stacked, kv_b_proj
    split into k_b_proj (transposed) and v_b_proj, the score correction bias renamed
    (ModelBase.filter_tensors). `nextn_layer`: the NextN block's eh_proj and enorm there under
    llama-arch.cpp's names (gguf 0.19's map for the architecture has none)."""
    heads, nope, v_dim = c["num_attention_heads"], c["qk_nope_head_dim"], c["v_head_dim"]
    experts: dict = {}
    for name, t in tensors.items():
        if ".mlp.experts." in name:
            collect_expert(experts, name, t)
            continue
        if name.endswith("kv_b_proj.weight"):
            k_b, v_b = t.view(heads, nope + v_dim, t.shape[-1]).split([nope, v_dim], dim=1)
            for half, data in (("k_b_proj", k_b.transpose(1, 2)), ("v_b_proj", v_b)):
                w.add_tensor(_gguf_name(maps, name.replace("kv_b_proj", half)), data.contiguous().numpy())
            continue
        name = name.replace("e_score_correction_bias", "e_score_correction.bias")
        kind = name.rsplit(".", 2)[-2]
        nextn = nextn_layer is not None and kind in ("eh_proj", "enorm")
        w.add_tensor(f"blk.{nextn_layer}.nextn.{kind}.weight" if nextn else _gguf_name(maps, name), t.contiguous().numpy())
    add_stacked_experts(w, maps, experts)


def write_gguf(w: gguf.GGUFWriter, out: Path) -> Path:
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


def _write_dbrx_metadata(w: gguf.GGUFWriter, c: dict) -> None:
    """DbrxModel.set_gguf_parameters, from DBRX's own config layout."""
    ffn, attn = c["ffn_config"], c["attn_config"]
    w.add_block_count(c["n_layers"])
    w.add_context_length(c["max_seq_len"])
    w.add_embedding_length(c["d_model"])
    w.add_feed_forward_length(ffn["ffn_hidden_size"])
    w.add_head_count(c["n_heads"])
    w.add_head_count_kv(attn["kv_n_heads"])
    w.add_rope_freq_base(attn["rope_theta"])
    w.add_clamp_kqv(attn["clip_qkv"])
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_expert_count(ffn["moe_num_experts"])
    w.add_expert_used_count(ffn["moe_top_k"])
    w.add_layer_norm_eps(1e-5)


def _write_metadata(w: gguf.GGUFWriter, c: dict, family: str, kv_b_split: bool, mtp: bool, gating_key: bool) -> None:
    if family == "dbrx":
        return _write_dbrx_metadata(w, c)
    rope = c.get("rope_parameters") or {}
    w.add_context_length(c["max_position_embeddings"])
    w.add_embedding_length(c["hidden_size"])
    w.add_block_count(c["num_hidden_layers"] + mtp)  # llama.cpp counts MTP blocks in block_count
    if mtp:
        w.add_nextn_predict_layers(1)
        # DeepSeek-V3's YaRN, as DeepseekV2Model.set_gguf_parameters writes it
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(40.0)
        w.add_rope_scaling_orig_ctx_len(4096)
        w.add_rope_scaling_yarn_log_mul(0.1)
    w.add_head_count(c["num_attention_heads"])
    w.add_layer_norm_rms_eps(c["rms_norm_eps"])
    w.add_rope_freq_base(rope.get("rope_theta", c.get("rope_theta")))
    w.add_expert_used_count(c["moe_k"] if family == "ernie4_5_moe" else c["num_experts_per_tok"])
    w.add_feed_forward_length(c["intermediate_size"])
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    if family == "qwen3_moe":
        w.add_head_count_kv(c["num_key_value_heads"])
        w.add_key_length(c["head_dim"])
        w.add_value_length(c["head_dim"])
        w.add_expert_count(c["num_local_experts"] if "num_local_experts" in c else c["num_experts"])
        w.add_expert_feed_forward_length(c["moe_intermediate_size"])
    elif family == "mixtral":
        w.add_head_count_kv(c["num_key_value_heads"])
        w.add_rope_dimension_count(c["hidden_size"] // c["num_attention_heads"])
        w.add_expert_count(c["num_local_experts"])
    elif family == "qwen2_moe":  # Qwen2MoeModel.set_gguf_parameters (no head_dim in Qwen2's config: no key_length)
        w.add_head_count_kv(c["num_key_value_heads"])
        w.add_expert_count(c["num_experts"])
        w.add_expert_feed_forward_length(c["moe_intermediate_size"])
        w.add_expert_shared_feed_forward_length(c["shared_expert_intermediate_size"])
    elif family == "olmoe":  # OlmoeModel.set_gguf_parameters: feed_forward_length (above) is the experts' width
        w.add_head_count_kv(c["num_key_value_heads"])
        w.add_expert_count(c["num_experts"])
        # llama.cpp's OlmoeModel writes no clamp (OLMoE's releases have clip_qkv null); the tiny model
        # clips, so the key OlmoModel writes for it is written, or the file would not describe the model
        w.add_clamp_kqv(c["clip_qkv"])
    elif family in ("glm4_moe", "dots1"):  # Glm4MoeModel / Dots1Model.set_gguf_parameters
        w.add_head_count_kv(c["num_key_value_heads"])
        w.add_key_length(c["head_dim"])  # (the base converter, from head_dim)
        w.add_value_length(c["head_dim"])
        w.add_expert_group_count(c["n_group"])  # (the base converter, from n_group and topk_group)
        w.add_expert_group_used_count(c["topk_group"])
        if family == "glm4_moe":
            factor = c.get("partial_rotary_factor", rope.get("partial_rotary_factor", 0.5))
            w.add_rope_dimension_count(int(c["head_dim"] * factor))
            w.add_nextn_predict_layers(c["num_nextn_predict_layers"])
        w.add_expert_count(c["n_routed_experts"])
        w.add_expert_feed_forward_length(c["moe_intermediate_size"])
        w.add_expert_shared_count(c["n_shared_experts"])
        w.add_leading_dense_block_count(c["first_k_dense_replace"])
        w.add_expert_weights_scale(c["routed_scaling_factor"])
        w.add_expert_weights_norm(c["norm_topk_prob"])
        w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)  # (dots1: from scoring_func "noaux_tc")
    elif family in ("granitemoe", "granitemoeshared"):  # GraniteMoeModel (GraniteModel, LlamaModel)
        w.add_head_count_kv(c["num_key_value_heads"])
        w.add_rope_dimension_count(c["hidden_size"] // c["num_attention_heads"])
        w.add_expert_count(c["num_local_experts"])
        w.add_attention_scale(c["attention_multiplier"])
        w.add_embedding_scale(c["embedding_multiplier"])
        w.add_residual_scale(c["residual_multiplier"])
        w.add_logit_scale(c["logits_scaling"])
        if c.get("shared_intermediate_size"):
            w.add_expert_shared_feed_forward_length(c["shared_intermediate_size"])
    elif family == "minimax_m2":  # MiniMaxM2Model.set_gguf_parameters (and the base's, from head_dim)
        w.add_head_count_kv(c["num_key_value_heads"])
        w.add_key_length(c["head_dim"])
        w.add_value_length(c["head_dim"])
        w.add_expert_count(c["num_local_experts"])
        w.add_expert_feed_forward_length(c["intermediate_size"])
        w.add_rope_dimension_count(c["rotary_dim"])
        w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)  # (the base's, from the release's scoring_func)
    elif family == "ernie4_5_moe":  # Ernie4_5MoeModel.set_gguf_parameters
        w.add_head_count_kv(c["num_key_value_heads"])
        w.add_expert_count(c["moe_num_experts"])
        w.add_interleave_moe_layer_step(c["moe_layer_interval"])
        w.add_leading_dense_block_count(c["moe_layer_start_index"])
        w.add_expert_feed_forward_length(c["moe_intermediate_size"])
        w.add_expert_shared_count(c["moe_num_shared_experts"])
        # (sic: llama.cpp writes intermediate_size // num_key_value_heads here; nothing reads it)
        w.add_expert_shared_feed_forward_length(c["intermediate_size"] // c["num_key_value_heads"])
    else:  # deepseek_v3 and deepseek_v2, as DeepseekV2Model.set_gguf_parameters writes them
        w.add_expert_count(c["n_routed_experts"])
        w.add_leading_dense_block_count(c["first_k_dense_replace"])
        if c["q_lora_rank"] is not None:  # (V2-Lite's query is one projection, q_proj)
            w.add_q_lora_rank(c["q_lora_rank"])
        w.add_kv_lora_rank(c["kv_lora_rank"])
        if kv_b_split:
            w.add_head_count_kv(1)
            w.add_key_length(c["kv_lora_rank"] + c["qk_rope_head_dim"])
            w.add_value_length(c["kv_lora_rank"])
            w.add_key_length_mla(c["qk_nope_head_dim"] + c["qk_rope_head_dim"])
            w.add_value_length_mla(c["v_head_dim"])
        else:
            w.add_head_count_kv(c["num_key_value_heads"])
            w.add_key_length(c["qk_nope_head_dim"] + c["qk_rope_head_dim"])
            w.add_value_length(c["v_head_dim"])
        w.add_rope_dimension_count(c["qk_rope_head_dim"])
        w.add_expert_feed_forward_length(c["moe_intermediate_size"])
        w.add_expert_shared_count(c["n_shared_experts"])
        w.add_expert_weights_scale(c["routed_scaling_factor"])
        w.add_expert_weights_norm(c["norm_topk_prob"])
        if gating_key:  # (from scoring_func: V3's sigmoid, V2's softmax; files before the key have none)
            softmax = family == "deepseek_v2"
            w.add_expert_gating_func(gguf.ExpertGatingFuncType.SOFTMAX if softmax else gguf.ExpertGatingFuncType.SIGMOID)
        if c["n_group"] is not None:  # (the base converter, where the config has them)
            w.add_expert_group_count(c["n_group"])
            w.add_expert_group_used_count(c["topk_group"])


def _add_byte_level_tokenizer(w: gguf.GGUFWriter, vocab_size: int) -> None:
    """A trivial byte-level BPE vocabulary (the tokenizer test uses a real one)."""
    tokens = ["t", "0"] + [f"t{i}" for i in range(vocab_size - 3)] + ["<|endoftext|>"]  # "t 0" merges to "t0"
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types([1] * (vocab_size - 1) + [3])
    w.add_token_merges(["t 0"])
    w.add_eos_token_id(vocab_size - 1)
    w.add_chat_template("{{ messages[0]['content'] }}")


def export_gguf(src: Path, out: Path, *, kv_b_split: bool = True, kv_b_qtype: GGMLQuantizationType | None = None,
                mtp: bool = False, flat: tuple[str, ...] = (),
                qtypes: dict[str, GGMLQuantizationType] | None = None, gating_key: bool = True,
                per_expert: bool = False, experts_qtype: GGMLQuantizationType | None = None) -> Path:
    """Write the HF checkpoint `src` as an F32 GGUF the way llama.cpp's converter would; with
    `mtp`, add a DeepSeek-style multi-token-prediction block after the last layer and YaRN; with
    `flat`, the [1, N] tensors whose HF names end so as [N] (llama.cpp sizes them {N});
    `qtypes`, GGUF tensors whose names end so quantized to that type (gguf-py's quantize); without
    `gating_key`, a DeepSeek file as written before expert_gating_func existed; `per_expert` and
    `experts_qtype` as for add_stacked_experts."""
    c = json.loads((src / "config.json").read_text())
    family = c["model_type"]
    arch = ARCH[family]
    num_layers = c.get("num_hidden_layers", c.get("n_layers"))
    maps = [gguf.get_tensor_name_map(arch, num_layers), gguf.get_tensor_name_map(MODEL_ARCH.LLAMA, num_layers)]
    w = gguf.GGUFWriter(out, MODEL_ARCH_NAMES[arch])
    _write_metadata(w, c, family, kv_b_split, mtp, gating_key)
    if mtp:
        w.add_tensor(f"blk.{num_layers}.nextn.eh_proj.weight", np.zeros((c["hidden_size"], 2 * c["hidden_size"]), np.float32))
        w.add_tensor(f"blk.{num_layers}.attn_norm.weight", np.ones(c["hidden_size"], np.float32))
    _add_byte_level_tokenizer(w, c["vocab_size"])
    tensors = load_all(src)
    experts: dict[tuple[int, str], dict[int, torch.Tensor]] = {}
    for name, t in tensors.items():
        parts = name.split(".")
        if family == "dbrx" and ".ffn.experts.mlp." in name:  # DbrxModel: flat [E * I, H] viewed [E, I, H]
            ffn = c["ffn_config"]
            t = t.view(ffn["moe_num_experts"], ffn["ffn_hidden_size"], c["d_model"])
            if name.endswith(".w2"):
                t = t.permute(0, 2, 1)  # down [E, H, I]
            w.add_tensor(_gguf_name(maps, name + ".weight"), t.contiguous().numpy())
            continue
        if ".experts." in name and "shared_experts" not in name:  # model.layers.L.{mlp|block_sparse_moe}.experts.E.proj.weight
            collect_expert(experts, name, t)
            continue
        if name.endswith("input_linear.weight"):  # Granite's fused gate|up rows, split by GraniteMoeModel
            shared = "shared_mlp" in name
            gate, up = t.split(c["shared_intermediate_size" if shared else "intermediate_size"], dim=-2)
            kinds = ((MODEL_TENSOR.FFN_GATE_SHEXP, MODEL_TENSOR.FFN_UP_SHEXP) if shared else
                     (MODEL_TENSOR.FFN_GATE_EXP, MODEL_TENSOR.FFN_UP_EXP))
            for kind, half in zip(kinds, (gate, up), strict=True):
                gname = TENSOR_NAMES[kind].format(bid=parts[2]) + ".weight"
                qtype = next((q for suffix, q in (qtypes or {}).items() if gname.endswith(suffix)), None)
                array = half.contiguous().numpy()
                if qtype is None:
                    w.add_tensor(gname, array)
                else:
                    w.add_tensor(gname, gguf.quants.quantize(array, qtype), raw_dtype=qtype)
            continue
        if family in LLAMA_PERMUTED and name.endswith(("q_proj.weight", "k_proj.weight")):
            kv = c["num_key_value_heads"] if "k_proj" in name else None
            t = llama_cpp_permute(t, c["num_attention_heads"], kv)
        if family in ("deepseek_v3", "deepseek_v2") and name.endswith("kv_b_proj.weight") and kv_b_split:
            heads, nope, v_dim = c["num_key_value_heads"], c["qk_nope_head_dim"], c["v_head_dim"]
            kv_b = t.view(heads, nope + v_dim, t.shape[-1])
            k_b, v_b = torch.split(kv_b, [nope, v_dim], dim=1)
            for half, data in (("k_b_proj", k_b.transpose(1, 2)), ("v_b_proj", v_b)):
                array = data.contiguous().numpy()
                gname = _gguf_name(maps, name.replace("kv_b_proj", half))
                if kv_b_qtype is None:
                    w.add_tensor(gname, array)
                else:
                    w.add_tensor(gname, gguf.quants.quantize(array, kv_b_qtype), raw_dtype=kv_b_qtype)
            continue
        name = name.replace("e_score_correction_bias", "e_score_correction.bias")  # as llama.cpp does
        if flat and name.endswith(flat):
            t = t.reshape(-1)
        w.add_tensor(_gguf_name(maps, name), t.contiguous().numpy())
    add_stacked_experts(w, maps, experts, per_expert=per_expert, qtype=experts_qtype)
    return write_gguf(w, out)


@pytest.mark.parametrize("family", ["qwen3_moe", "mixtral", "deepseek_v3", "qwen2_moe", "olmoe", "glm4_moe", "dots1",
                                    "granitemoe", "granitemoeshared", "ernie4_5_moe", "dbrx", "minimax_m2", "deepseek_v2"])
def test_hf_to_gguf_to_ftw_round_trip(family: str, tmp_path: Path) -> None:
    src = save_checkpoint(family, tmp_path / "hf")
    path = export_gguf(src, tmp_path / "model.gguf")
    index = convert_gguf(path, tmp_path / "ftw")
    reader = assert_round_trip(src, tmp_path / "ftw")
    reader.verify()
    direct = convert_checkpoint(src, tmp_path / "ftw-hf")
    assert index.family == direct.family == family
    assert index.config == direct.config
    assert {t.name for t in index.tensors} == {t.name for t in direct.tensors}
    assert [(b.layer, [(p.name, p.dtype, p.shape) for p in b.parts]) for b in index.banks] == \
        [(b.layer, [(p.name, p.dtype, p.shape) for p in b.parts]) for b in direct.banks]
    hf_config = json.loads((src / "config.json").read_text())
    for key in ("hidden_size", "num_hidden_layers", "num_attention_heads", "rms_norm_eps", "vocab_size",
                "num_experts_per_tok", "tie_word_embeddings", "max_position_embeddings", "model_type", "architectures"):
        if key in hf_config:  # (ERNIE names its top-k moe_k)
            assert index.source_config[key] == hf_config[key], key
    assert index.metadata["source_format"] == "gguf"


def test_deepseek_legacy_kv_b(tmp_path: Path) -> None:
    src = save_checkpoint("deepseek_v3", tmp_path / "hf")
    path = export_gguf(src, tmp_path / "model.gguf", kv_b_split=False)
    index = convert_gguf(path, tmp_path / "ftw")
    assert_round_trip(src, tmp_path / "ftw")
    assert index.config == convert_checkpoint(src, tmp_path / "ftw-hf").config


def test_deepseek_quantized_kv_b_is_dequantized(tmp_path: Path) -> None:
    from transformers import AutoConfig, AutoModelForCausalLM

    from tests.checkpoints import FAMILY_CONFIGS

    # kv_b's halves need rows of whole Q8_0 blocks (32): wider MLA sizes than the stock tiny model
    config = dict(FAMILY_CONFIGS["deepseek_v3"], kv_lora_rank=32, qk_nope_head_dim=32, v_head_dim=32)
    torch.manual_seed(0)
    src = tmp_path / "hf"
    AutoModelForCausalLM.from_config(AutoConfig.for_model("deepseek_v3", **config)).save_pretrained(src)
    path = export_gguf(src, tmp_path / "model.gguf", kv_b_qtype=GGMLQuantizationType.Q8_0)
    index = convert_gguf(path, tmp_path / "ftw")
    reader = FTWReader.open(tmp_path / "ftw")
    for layer in range(config["num_hidden_layers"]):
        name = f"model.layers.{layer}.self_attn.kv_b_proj.weight"
        assert index.tensor(name).dtype == "f32"
        want = load_all(src)[name]
        heads, nope, v_dim = config["num_key_value_heads"], 32, 32
        k_b, v_b = torch.split(want.view(heads, nope + v_dim, -1), [nope, v_dim], dim=1)
        q = GGMLQuantizationType.Q8_0
        k_ref = gguf.quants.dequantize(gguf.quants.quantize(k_b.transpose(1, 2).contiguous().numpy(), q), q)
        v_ref = gguf.quants.dequantize(gguf.quants.quantize(v_b.contiguous().numpy(), q), q)
        ref = np.concatenate([k_ref.transpose(0, 2, 1), v_ref], axis=1).reshape(want.shape)
        assert np.array_equal(reader.tensor(name).numpy(), ref)
        assert torch.allclose(reader.tensor(name), want, atol=0.01)


@pytest.mark.parametrize("family", ["qwen3_moe", "qwen2_moe", "minimax_m2"])  # (the MoE ones transformers reads)
def test_config_agrees_with_transformers_gguf_loader(family: str, tmp_path: Path) -> None:
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    path = export_gguf(save_checkpoint(family, tmp_path / "hf"), tmp_path / "model.gguf")
    theirs = load_gguf_checkpoint(str(path), return_tensors=False)["config"]
    ours = convert_gguf(path, tmp_path / "ftw").source_config
    shared = set(theirs) & set(ours)
    assert len(shared) >= 14
    for key in shared:
        want = theirs[key]
        assert ours[key] == (pytest.approx(want, rel=1e-6) if isinstance(want, float) else want), key


def test_byte_level_bpe_tokenizer_round_trip(tmp_path: Path) -> None:
    """The tiny model's byte-level BPE, stored in GGUF as llama.cpp stores a gpt2 vocabulary, comes
    back as a tokenizer.json that encodes and decodes like the original."""
    from tokenizers import Tokenizer

    from ftpull.tiny import CHAT_TEMPLATE, ENDOFTEXT_ID, IM_END_ID, build_tiny_tokenizer
    from ftw.gguf_file import GGUFModel
    from ftw.gguf_tokenizer import gguf_tokenizer_config, gguf_tokenizer_json

    original = build_tiny_tokenizer()
    vocab = original.get_vocab(with_added_tokens=True)
    added = original.get_added_tokens_decoder()
    tokens = [""] * len(vocab)
    for token, i in vocab.items():
        tokens[i] = token
    types = [(3 if added[i].special else 4) if i in added else 1 for i in range(len(tokens))]
    merges = [" ".join(pair) for pair in json.loads(original.to_str())["model"]["merges"]]
    w = gguf.GGUFWriter(tmp_path / "tok.gguf", "qwen3moe")
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(ENDOFTEXT_ID)
    w.add_eos_token_id(IM_END_ID)
    w.add_add_bos_token(False)
    w.add_chat_template(CHAT_TEMPLATE)
    w.add_tensor("token_embd.weight", np.zeros((4, 4), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with GGUFModel(tmp_path / "tok.gguf") as model:
        rebuilt = Tokenizer.from_str(json.dumps(gguf_tokenizer_json(model)))
        config = gguf_tokenizer_config(model)
    texts = [
        "Hello, world! It's 2025 and we'll test   spaces\n\nand newlines.\r\n",
        "<|im_start|>user\nWhat is 12345 * 678?<|im_end|>\n<think>\n</think>",
        "naïve café, 東京, Ελληνικά, emoji 🙂 and tabs\there",
        "'S 'LL contractions' edge-cases... ---> ==> \u00a0",
    ]
    for text in texts:
        want = original.encode(text)
        got = rebuilt.encode(text)
        assert got.ids == want.ids, text
        assert rebuilt.decode(got.ids, skip_special_tokens=False) == text
    assert config["chat_template"] == CHAT_TEMPLATE
    assert (config["bos_token"], config["eos_token"]) == ("<|endoftext|>", "<|im_end|>")
    assert config["added_tokens_decoder"][str(IM_END_ID)]["special"] is True
    assert config["added_tokens_decoder"][str(IM_END_ID + 4)]["special"] is False  # <think>


def test_deepseek_mtp_block_dropped_and_yarn_config(tmp_path: Path) -> None:
    src = save_checkpoint("deepseek_v3", tmp_path / "hf")
    index = convert_gguf(export_gguf(src, tmp_path / "model.gguf", mtp=True), tmp_path / "ftw")
    assert_round_trip(src, tmp_path / "ftw")
    assert index.metadata["dropped_tensors"] == 2
    assert index.source_config["num_hidden_layers"] == 3 and index.source_config["num_nextn_predict_layers"] == 1
    assert index.source_config["rope_scaling"] == {
        "type": "yarn", "rope_type": "yarn", "factor": 40.0, "original_max_position_embeddings": 4096,
        "mscale": 1.0, "mscale_all_dim": 1.0}


@pytest.mark.parametrize("family, name", [("qwen2_moe", "mlp.shared_expert_gate.weight"),
                                          ("ernie4_5_moe", "mlp.moe_statics.e_score_correction_bias")])
def test_row_vectors_stored_flat(family: str, name: str, tmp_path: Path) -> None:
    """Qwen2-MoE's shared_expert_gate [1, H] and ERNIE's correction bias [1, E], stored 1-D, come back [1, N]."""
    src = save_checkpoint(family, tmp_path / "hf")
    convert_gguf(export_gguf(src, tmp_path / "model.gguf", flat=(name.replace("_bias", ".bias"),)), tmp_path / "ftw")
    reader = assert_round_trip(src, tmp_path / "ftw")
    got = reader.tensor(f"model.layers.{1 if family == 'ernie4_5_moe' else 0}.{name}")
    assert got.dim() == 2 and got.shape[0] == 1


@pytest.mark.parametrize("up_qtype", [GGMLQuantizationType.Q8_0, None])
def test_granite_shared_mlp_quantized_halves_are_joined(up_qtype: GGMLQuantizationType | None, tmp_path: Path) -> None:
    """granitemoeshared's shared_mlp.input_linear, split by llama.cpp into gate and up: halves of one
    quantization join as stored; a gate in Q8_0 beside an f32 up is dequantized and joined in f32."""
    src = save_checkpoint("granitemoeshared", tmp_path / "hf")
    q = GGMLQuantizationType.Q8_0
    qtypes = {"ffn_gate_shexp.weight": q} | ({"ffn_up_shexp.weight": up_qtype} if up_qtype else {})
    index = convert_gguf(export_gguf(src, tmp_path / "model.gguf", qtypes=qtypes), tmp_path / "ftw")
    reader = FTWReader.open(tmp_path / "ftw")
    name = "model.layers.0.shared_mlp.input_linear.weight"
    gate, up = load_all(src)[name].chunk(2)
    if up_qtype is None:
        assert index.tensor(name).dtype == "f32"
        ref = np.concatenate([gguf.quants.dequantize(gguf.quants.quantize(gate.numpy(), q), q), up.numpy()])
        assert np.array_equal(reader.tensor(name).numpy(), ref)
    else:
        assert index.tensor(name).dtype == "q8_0"
        raw = np.concatenate([gguf.quants.quantize(half.contiguous().numpy(), q) for half in (gate, up)])
        assert reader.tensor(name).numpy().tobytes() == raw.tobytes()


def test_deepseek2_without_a_gating_key_is_deepseek_v2(tmp_path: Path) -> None:
    """A deepseek2 file from before expert_gating_func (DeepSeek-V2, V2.5, Coder-V2 GGUFs of 2024) routes
    by softmax, as llama.cpp reads it: DeepSeek-V2."""
    src = save_checkpoint("deepseek_v2", tmp_path / "hf")
    index = convert_gguf(export_gguf(src, tmp_path / "model.gguf", gating_key=False), tmp_path / "ftw")
    assert_round_trip(src, tmp_path / "ftw")
    assert index.family == "deepseek_v2" and index.config == convert_checkpoint(src, tmp_path / "ftw-hf").config
    assert (index.source_config["scoring_func"], index.source_config["topk_method"]) == ("softmax", "greedy")


@pytest.mark.parametrize("blocks, vocab, model_type", [(48, 154880, "glm4_moe_lite"), (47, 154880, "glm4_moe_lite"),
                                                       (27, 154880, "deepseek_v2"), (48, 102400, "deepseek_v2")])
def test_deepseek2_without_a_gating_key_is_told_as_llama_cpp_tells_it(blocks: int, vocab: int, model_type: str) -> None:
    """llama.cpp's loader reads a deepseek2 file without expert_gating_func as softmax (DeepSeek-V2), except
    GLM-4.7-Flash's (47 or 48 blocks, 154880 tokens), which routes by sigmoid (ft's glm4_moe_lite: DeepSeek-V3's
    model)."""
    from types import SimpleNamespace

    from ftw.gguf_source import ARCHITECTURES

    arch = "deepseek2"
    metadata = {f"{arch}.{k}": v for k, v in dict(
        block_count=blocks, nextn_predict_layers=1, embedding_length=64, **{"attention.head_count": 4},
        **{"rope.dimension_count": 8, "attention.key_length": 16, "attention.value_length": 16,
           "attention.kv_lora_rank": 16, "feed_forward_length": 128, "expert_feed_forward_length": 32,
           "expert_count": 8, "expert_used_count": 2}).items()}
    tensors = {"token_embd.weight": SimpleNamespace(shape=(vocab, 64))}
    model = SimpleNamespace(path="stub.gguf", metadata=metadata, tensors=tensors)
    assert ARCHITECTURES[arch].hf_config(model)["model_type"] == model_type
