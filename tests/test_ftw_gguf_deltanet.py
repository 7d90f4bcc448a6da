"""The Gated DeltaNet hybrids as GGUF files, Qwen3.5/3.6 MoE (`qwen35moe`) and Qwen3-Next
(`qwen3next`), written the way llama.cpp's converter writes them (conversion/qwen.py:
Qwen3_5MoeTextModel over _LinearAttentionVReorderBase, Qwen3NextModel and Qwen2MoeModel, at
llama.cpp 0c1e570), pulled through ft and run against transformers.

`export_qwen35_gguf` follows that converter, not ftw/gguf_names.py: gguf-py's own tensor names;
the DeltaNet's value heads reordered from grouped by key head to tiled (v's rows of in_proj_qkv
and of the conv, in_proj_z's, in_proj_a's and _b's rows, A_log, dt_bias, out_proj's columns);
A_log stored as -exp(A_log), dt_bias as ssm_dt.bias, the conv squeezed, every RMSNorm but the
DeltaNet's output norm stored as 1 + w; the experts stacked; the vision tower and MTP left out.
The tiny model has 2 key heads and 4 value heads, so the tiled order differs from transformers'.
Qwen3-Next's file keeps the grouped order, and newer converters split its in_proj_qkvz into
attn_qkv and attn_gate (older ones kept it whole as ssm_in): both are tested.
"""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import pytest
import torch
from gguf.constants import MODEL_ARCH

from ftw.gguf_convert import convert_gguf
from tests import checkpoints
from tests.checkpoints import load_all, save_checkpoint
from tests.parity import assert_parity, convert_and_load
from tests.test_ftw_gguf_hf import (
    _add_byte_level_tokenizer,
    _gguf_name,
    add_stacked_experts,
    collect_expert,
    write_gguf,
)
from tests.test_parity import PROMPT, STEPS, hf_model

pytest.importorskip("transformers")

TEXT_PREFIX = "model.language_model."


def reorder_v_heads(tensor: torch.Tensor, dim: int, num_k_heads: int, num_v_per_k: int, head_dim: int) -> torch.Tensor:
    """_LinearAttentionVReorderBase._reorder_v_heads: grouped (by key head) to tiled along `dim`."""
    shape = list(tensor.shape)
    dim = dim + len(shape) if dim < 0 else dim
    new_shape = shape[:dim] + [num_k_heads, num_v_per_k, head_dim] + shape[dim + 1:]
    perm = list(range(len(new_shape)))
    perm[dim], perm[dim + 1] = perm[dim + 1], perm[dim]
    return tensor.reshape(*new_shape).permute(*perm).contiguous().reshape(*shape)


def llama_cpp_tensor(name: str, t: torch.Tensor, c: dict, *, tiled: bool = True) -> tuple[str, torch.Tensor]:
    """One text tensor as llama.cpp's modify_tensors chain leaves it (name still HF's, "model." rooted);
    `tiled`: Qwen3.5's reorder of the value heads first."""
    k_heads, v_heads = c["linear_num_key_heads"], c["linear_num_value_heads"]
    k_dim, v_dim, per_k = c["linear_key_head_dim"], c["linear_value_head_dim"], v_heads // k_heads
    if tiled and "linear_attn." in name and k_heads != v_heads:  # _LinearAttentionVReorderBase.modify_tensors
        if ".in_proj_qkv." in name:
            qk = 2 * k_heads * k_dim
            t = torch.cat([t[:qk], reorder_v_heads(t[qk:], 0, k_heads, per_k, v_dim)])
        elif ".in_proj_z." in name:
            t = reorder_v_heads(t, 0, k_heads, per_k, v_dim)
        elif ".in_proj_b." in name or ".in_proj_a." in name:
            t = reorder_v_heads(t, 0, k_heads, per_k, 1)
        elif ".A_log" in name or ".dt_bias" in name:
            t = reorder_v_heads(t.unsqueeze(-1), 0, k_heads, per_k, 1).squeeze(-1)
        elif ".conv1d" in name:
            data, qk = t.squeeze(), 2 * k_heads * k_dim
            t = torch.cat([data[:qk], reorder_v_heads(data[qk:], 0, k_heads, per_k, v_dim)])
        elif ".out_proj." in name:
            t = reorder_v_heads(t, 1, k_heads, per_k, v_dim)
    if name.endswith(".A_log"):  # Qwen3NextModel.modify_tensors
        t = -torch.exp(t)
    elif name.endswith(".dt_bias"):
        name = name.rpartition(".dt_bias")[0] + ".dt_proj.bias"
    elif "conv1d" in name:
        t = t.squeeze()
    elif name.endswith("norm.weight") and not name.endswith("linear_attn.norm.weight"):
        t = t + 1
    return name, t


def _write_deltanet_metadata(w: gguf.GGUFWriter, c: dict) -> None:
    """TextModel's, Qwen2MoeModel's and Qwen3NextModel's keys."""
    layers, head_dim = c["num_hidden_layers"], c["head_dim"]
    rope = c.get("rope_parameters") or {"rope_theta": c.get("rope_theta", 10000.0)}
    w.add_block_count(layers)
    w.add_context_length(c["max_position_embeddings"])
    w.add_embedding_length(c["hidden_size"])
    w.add_head_count(c["num_attention_heads"])
    w.add_head_count_kv(c["num_key_value_heads"])
    w.add_rope_freq_base(rope["rope_theta"])
    w.add_layer_norm_rms_eps(c["rms_norm_eps"])
    w.add_expert_count(c["num_experts"])
    w.add_expert_used_count(c["num_experts_per_tok"])
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_expert_feed_forward_length(c["moe_intermediate_size"])
    w.add_expert_shared_feed_forward_length(c["shared_expert_intermediate_size"])
    w.add_ssm_conv_kernel(c["linear_conv_kernel_dim"])
    w.add_ssm_state_size(c["linear_key_head_dim"])
    w.add_ssm_group_count(c["linear_num_key_heads"])
    w.add_ssm_time_step_rank(c["linear_num_value_heads"])
    w.add_ssm_inner_size(c["linear_value_head_dim"] * c["linear_num_value_heads"])
    w.add_full_attention_interval(c.get("full_attention_interval", 4))
    w.add_rope_dimension_count(int(head_dim * rope.get("partial_rotary_factor", c.get("partial_rotary_factor", 0.25))))
    if c.get("intermediate_size"):
        w.add_feed_forward_length(c["intermediate_size"])


def export_qwen35_gguf(src: Path, out: Path) -> Path:
    """The Qwen3.5 MoE checkpoint `src` (transformers' ConditionalGeneration layout) as an F32 qwen35moe GGUF."""
    c = json.loads((src / "config.json").read_text())["text_config"]
    layers = c["num_hidden_layers"]
    w = gguf.GGUFWriter(out, "qwen35moe")
    _write_deltanet_metadata(w, c)
    w.add_rope_dimension_sections([11, 11, 10, 0])  # _Qwen35MRopeMixin's default
    _add_byte_level_tokenizer(w, c["vocab_size"])
    maps = [gguf.get_tensor_name_map(MODEL_ARCH.QWEN35MOE, layers)]
    experts: dict[tuple[int, str], dict[int, torch.Tensor]] = {}
    for name, t in load_all(src).items():
        if name.startswith(("model.visual.", "mtp.")):
            continue
        name = "model." + name[len(TEXT_PREFIX):] if name.startswith(TEXT_PREFIX) else name
        if ".mlp.experts." in name:  # model.layers.L.mlp.experts.E.proj.weight, stacked by Qwen2MoeModel
            collect_expert(experts, name, t)
            continue
        name, t = llama_cpp_tensor(name, t, c)
        w.add_tensor(_gguf_name(maps, name), t.float().contiguous().numpy())
    add_stacked_experts(w, maps, experts)
    return write_gguf(w, out)


def split_qkvz(t: torch.Tensor, c: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """Qwen3NextModel.modify_tensors' in_proj_qkvz [per key head: q | k | v (r heads) | z (r heads)]
    -> (attn_qkv [q of all heads | k | v], attn_gate [z])."""
    k_heads, per_k = c["linear_num_key_heads"], c["linear_num_value_heads"] // c["linear_num_key_heads"]
    k_dim, v_dim, hidden = c["linear_key_head_dim"], c["linear_value_head_dim"], c["hidden_size"]
    sizes = [k_dim, k_dim, per_k * v_dim, per_k * v_dim]
    q, k, v, z = torch.split(t.permute(1, 0).contiguous().view(-1, k_heads, sum(sizes)), sizes, dim=-1)
    q, k, v, z = (part.contiguous().view(hidden, -1) for part in (q, k, v, z))
    return torch.cat([q, k, v], dim=-1).permute(1, 0).contiguous(), z.permute(1, 0).contiguous()


def export_qwen3next_gguf(src: Path, out: Path, *, whole_qkvz: bool = False) -> Path:
    """The Qwen3-Next checkpoint `src` as an F32 qwen3next GGUF; `whole_qkvz`: as older converters
    wrote it (ssm_in)."""
    c = json.loads((src / "config.json").read_text())
    layers = c["num_hidden_layers"]
    w = gguf.GGUFWriter(out, "qwen3next")
    _write_deltanet_metadata(w, c)
    _add_byte_level_tokenizer(w, c["vocab_size"])
    maps = [gguf.get_tensor_name_map(MODEL_ARCH.QWEN3NEXT, layers)]
    experts: dict[tuple[int, str], dict[int, torch.Tensor]] = {}
    for name, t in load_all(src).items():
        if name.startswith("mtp."):
            continue
        parts = name.split(".")
        if ".mlp.experts." in name:
            collect_expert(experts, name, t)
            continue
        if name.endswith("in_proj_qkvz.weight") and not whole_qkvz:
            qkv, z = split_qkvz(t, c)
            w.add_tensor(f"blk.{parts[2]}.attn_qkv.weight", qkv.float().numpy())
            w.add_tensor(f"blk.{parts[2]}.attn_gate.weight", z.float().numpy())
            continue
        name, t = llama_cpp_tensor(name, t, c, tiled=False)
        w.add_tensor(_gguf_name(maps, name), t.float().contiguous().numpy())
    add_stacked_experts(w, maps, experts)
    return write_gguf(w, out)


@pytest.mark.parametrize("whole_qkvz", [False, True], ids=["split", "whole"])
def test_qwen3next_gguf_generates_what_transformers_does(whole_qkvz: bool, tmp_path: Path, monkeypatch) -> None:
    # llama.cpp's qwen3next graph renormalizes the top-k (its file has no key for it), as the release does
    monkeypatch.setattr(checkpoints, "QWEN3_NEXT", {**checkpoints.QWEN3_NEXT, "norm_topk_prob": True})
    src = save_checkpoint("qwen3_next", tmp_path / "hf", seed=1)
    ours = convert_and_load(export_qwen3next_gguf(src, tmp_path / "model.gguf", whole_qkvz=whole_qkvz),
                            tmp_path / "store")
    assert ours.config.get("linear_value_head_order", "grouped") == "grouped"
    assert_parity(ours, hf_model(src), PROMPT, STEPS)


def test_qwen35moe_gguf_generates_what_transformers_does(tmp_path: Path) -> None:
    src = save_checkpoint("qwen3_5_moe", tmp_path / "hf", seed=1)
    path = export_qwen35_gguf(src, tmp_path / "model.gguf")
    ours = convert_and_load(path, tmp_path / "store")
    assert ours.config.get("linear_value_head_order") == "tiled"
    assert ours.config.get("layer_types") == ["linear_attention"] * 3 + ["full_attention"]
    assert_parity(ours, hf_model(src), PROMPT, STEPS)


def test_the_reversible_changes_come_back(tmp_path: Path) -> None:
    """A_log, the conv's [C, 1, K] and the (1 + w) norms are the HF checkpoint's again (to float32
    rounding); the tiled tensors are kept as the file has them."""
    src = save_checkpoint("qwen3_5_moe", tmp_path / "hf", seed=1)
    index = convert_gguf(export_qwen35_gguf(src, tmp_path / "model.gguf"), tmp_path / "ftw")
    from ftw import FTWReader

    reader, hf = FTWReader.open(tmp_path / "ftw"), load_all(src)
    assert index.source_config["linear_value_head_order"] == "tiled"
    for name in ("layers.1.input_layernorm.weight", "layers.3.self_attn.q_norm.weight", "norm.weight",
                 "layers.2.linear_attn.norm.weight"):
        torch.testing.assert_close(reader.tensor(TEXT_PREFIX + name), hf[TEXT_PREFIX + name], rtol=0, atol=1e-6)
    c = json.loads((src / "config.json").read_text())["text_config"]
    conv, hf_conv = reader.tensor(TEXT_PREFIX + "layers.0.linear_attn.conv1d.weight"), hf[TEXT_PREFIX + "layers.0.linear_attn.conv1d.weight"]
    qk = 2 * c["linear_num_key_heads"] * c["linear_key_head_dim"]
    assert conv.shape == hf_conv.shape  # [C, 1, K] again
    assert torch.equal(conv[:qk], hf_conv[:qk])  # (its value channels are tiled)
    a_log = hf[TEXT_PREFIX + "layers.0.linear_attn.A_log"]
    tiled = reorder_v_heads(a_log.unsqueeze(-1), 0, c["linear_num_key_heads"], 2, 1).squeeze(-1)
    assert not torch.equal(tiled, a_log)  # (the order matters in this model)
    torch.testing.assert_close(reader.tensor(TEXT_PREFIX + "layers.0.linear_attn.A_log"), tiled, rtol=1e-6, atol=1e-6)
