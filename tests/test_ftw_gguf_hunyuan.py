"""Hunyuan (hunyuan_v1_moe) as a GGUF file (`hunyuan-moe`), written the way llama.cpp's converter
writes it (conversion/hunyuan.py, HunYuanMoEModel, at llama.cpp 0c1e570), pulled through ft and
run against transformers.

`export_hunyuan_gguf` follows that converter, not ftw/gguf_names.py: gguf-py's tensor names
(query_layernorm as attn_q_norm, the router gate.wg as ffn_gate_inp, the shared MLP as the
*_shexp tensors), the experts stacked, and the NTK alpha of Hunyuan's "dynamic" RoPE folded into
rope.freq_base (base * alpha^(d / (d - 2))) with no scaling type of its own.
"""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import pytest
import torch
from gguf.constants import MODEL_ARCH

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


def export_hunyuan_gguf(src: Path, out: Path) -> Path:
    c = json.loads((src / "config.json").read_text())
    rope = c["rope_parameters"]
    w = gguf.GGUFWriter(out, "hunyuan-moe")
    w.add_block_count(c["num_hidden_layers"])  # (TextModel's keys)
    w.add_context_length(c["max_position_embeddings"])
    w.add_embedding_length(c["hidden_size"])
    w.add_feed_forward_length(c["intermediate_size"])
    w.add_head_count(c["num_attention_heads"])
    w.add_head_count_kv(c["num_key_value_heads"])
    w.add_layer_norm_rms_eps(c["rms_norm_eps"])
    w.add_expert_count(c["num_experts"])
    w.add_key_length(c["head_dim"])
    w.add_value_length(c["head_dim"])
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_expert_shared_feed_forward_length(c["intermediate_size"])  # (HunYuanMoEModel's)
    w.add_expert_feed_forward_length(c.get("moe_intermediate_size") or c["intermediate_size"])
    w.add_expert_used_count(c["moe_topk"])
    w.add_expert_shared_count(1)
    dim = c["hidden_size"] // c["num_attention_heads"]
    w.add_rope_freq_base(rope["rope_theta"] * rope["alpha"] ** (dim / (dim - 2)))
    w.add_rope_scaling_type(gguf.RopeScalingType.NONE)
    w.add_rope_scaling_factor(1)
    _add_byte_level_tokenizer(w, c["vocab_size"])
    maps = [gguf.get_tensor_name_map(MODEL_ARCH.HUNYUAN_MOE, c["num_hidden_layers"])]
    experts: dict[tuple[int, str], dict[int, torch.Tensor]] = {}
    for name, t in load_all(src).items():
        if ".mlp.experts." in name:
            collect_expert(experts, name, t)
            continue
        w.add_tensor(_gguf_name(maps, name), t.float().contiguous().numpy())
    add_stacked_experts(w, maps, experts)
    return write_gguf(w, out)


def test_hunyuan_gguf_generates_what_transformers_does(tmp_path: Path) -> None:
    src = save_checkpoint("hunyuan_v1_moe", tmp_path / "hf", seed=1)
    ours = convert_and_load(export_hunyuan_gguf(src, tmp_path / "model.gguf"), tmp_path / "store")
    assert ours.config.num_experts_per_tok == 2
    assert_parity(ours, hf_model(src), PROMPT, STEPS)
