"""gpt-oss as a GGUF file, written the way llama.cpp's converter writes it (conversion/gpt_oss.py,
GptOssModel, at llama.cpp 0c1e570), pulled through ft and run against transformers.

`export_gpt_oss_gguf` follows that converter, not ftw/gguf_names.py: gguf-py's own tensor names
(the sinks as `attn_sinks.weight`, the router as `ffn_gate_inp`), the experts' interleaved
gate_up_proj split into gate (even rows) and up (odd rows), biases alike; float experts transposed
to [E, out, in]; MXFP4 experts repacked into GGML's MXFP4 blocks (`repack_mxfp4`, verbatim in
effect). The released checkpoints' experts are MXFP4, so those are what gpt-oss GGUFs hold: ft
keeps their bytes (an FTW `mxfp4` bank), a third of the bf16 it makes of the Hugging Face files.
"""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from gguf.constants import MODEL_ARCH, GGMLQuantizationType

from ftw import FTWReader, convert_checkpoint
from ftw.gguf_convert import convert_gguf
from ftw.gguf_file import GGUFModel
from ftw.gguf_source import architecture_for
from tests.checkpoints import FAMILY_CONFIGS, load_all, save_checkpoint, to_mxfp4
from tests.parity import assert_parity, convert_and_load
from tests.test_ftw_gguf_hf import _add_byte_level_tokenizer, _gguf_name, write_gguf
from tests.test_parity import PROMPT, STEPS

pytest.importorskip("transformers")

# what llama.cpp's gpt-oss graph computes whatever the file says (no GGUF key carries them): the
# released clamped SwiGLU. The tiny checkpoint's own (1.3, 1.5) are what tests/test_parity.py uses.
RELEASED_ACTIVATION = dict(swiglu_alpha=1.702, swiglu_limit=7.0)


def transform_nibble_layout(tensor: torch.Tensor) -> torch.Tensor:
    """GptOssModel.transform_nibble_layout: HF's byte i (values 2i low, 2i + 1 high) to GGML's
    (value j low, j + 16 high) within each 16-byte block."""
    t_lo, t_hi = tensor & 0x0F, tensor & 0xF0
    tensor = (t_lo << 4) | (t_hi >> 4)
    blk_a, blk_b = tensor.chunk(2, dim=-1)
    blk_a = torch.stack(((blk_a & 0xF0).view(-1, 1), (blk_a << 4).view(-1, 1)), dim=2).view(tensor.shape)
    blk_b = torch.stack(((blk_b >> 4).view(-1, 1), (blk_b & 0x0F).view(-1, 1)), dim=2).view(tensor.shape)
    out = blk_a | blk_b
    return ((out & 0xF0) >> 4) | ((out & 0x0F) << 4)


def repack_mxfp4(blocks: torch.Tensor, scales: torch.Tensor) -> np.ndarray:
    """GptOssModel.repack_mxfp4: each block's e8m0 byte, then its 16 bytes of nibbles, flattened
    per row: uint8 [E, rows, G * 17]."""
    data = torch.concat((scales.unsqueeze(-1), transform_nibble_layout(blocks)), dim=-1)
    return data.reshape(data.shape[0], data.shape[1], -1).contiguous().numpy()


def _write_metadata(w: gguf.GGUFWriter, c: dict) -> None:
    """TextModel.set_gguf_parameters for gpt-oss's config, then GptOssModel's own two keys."""
    rope = c["rope_parameters"]
    w.add_block_count(c["num_hidden_layers"])
    w.add_context_length(c["max_position_embeddings"])
    w.add_embedding_length(c["hidden_size"])
    w.add_feed_forward_length(c["intermediate_size"])
    w.add_head_count(c["num_attention_heads"])
    w.add_head_count_kv(c["num_key_value_heads"])
    w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
    w.add_rope_scaling_factor(rope["factor"])
    w.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
    w.add_rope_scaling_yarn_beta_fast(rope["beta_fast"])
    w.add_rope_scaling_yarn_beta_slow(rope["beta_slow"])
    w.add_rope_freq_base(rope["rope_theta"])
    w.add_layer_norm_rms_eps(c["rms_norm_eps"])
    w.add_expert_count(c["num_local_experts"])
    w.add_expert_used_count(c["num_experts_per_tok"])
    w.add_key_length(c["head_dim"])
    w.add_value_length(c["head_dim"])
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_sliding_window(c["sliding_window"])
    w.add_expert_feed_forward_length(c["intermediate_size"])


def export_gpt_oss_gguf(src: Path, out: Path) -> Path:
    """The gpt-oss checkpoint `src` (float experts, or MXFP4 ones as released) as llama.cpp writes it."""
    c = json.loads((src / "config.json").read_text())
    maps = [gguf.get_tensor_name_map(MODEL_ARCH.GPT_OSS, c["num_hidden_layers"])]
    w = gguf.GGUFWriter(out, "gpt-oss")
    _write_metadata(w, c)
    _add_byte_level_tokenizer(w, c["vocab_size"])
    tensors = load_all(src)
    for name, t in tensors.items():
        if ".mlp.experts." not in name:
            name = name + ".weight" if "sinks" in name else name  # GptOssModel.filter_tensors
            w.add_tensor(_gguf_name(maps, name), t.float().contiguous().numpy())
            continue
        base, what = name.rsplit(".", 1)  # ...mlp.experts, gate_up_proj[_bias|_blocks|_scales] or down_proj[...]
        if what == "gate_up_proj_bias":
            for half, rows in (("gate_proj", t[..., ::2]), ("up_proj", t[..., 1::2])):
                w.add_tensor(_gguf_name(maps, f"{base}.{half}.bias"), rows.float().contiguous().numpy())
        elif what == "down_proj_bias":
            w.add_tensor(_gguf_name(maps, f"{base}.down_proj.bias"), t.float().contiguous().numpy())
        elif what == "gate_up_proj":  # [E, H, 2I], x @ W: transposed, then split
            t = t.transpose(-1, -2)
            for half, rows in (("gate_proj", t[:, ::2, :]), ("up_proj", t[:, 1::2, :])):
                w.add_tensor(_gguf_name(maps, f"{base}.{half}.weight"), rows.float().contiguous().numpy())
        elif what == "down_proj":
            w.add_tensor(_gguf_name(maps, f"{base}.down_proj.weight"), t.transpose(-1, -2).float().contiguous().numpy())
        elif what == "gate_up_proj_scales":
            blocks = tensors[f"{base}.gate_up_proj_blocks"]
            for half, sl in (("gate_proj", slice(0, None, 2)), ("up_proj", slice(1, None, 2))):
                w.add_tensor(_gguf_name(maps, f"{base}.{half}.weight"), repack_mxfp4(blocks[:, sl], t[:, sl]),
                             raw_dtype=GGMLQuantizationType.MXFP4)
        elif what == "down_proj_scales":
            w.add_tensor(_gguf_name(maps, f"{base}.down_proj.weight"),
                         repack_mxfp4(tensors[f"{base}.down_proj_blocks"], t), raw_dtype=GGMLQuantizationType.MXFP4)
    return write_gguf(w, out)


@pytest.fixture
def released_activation(monkeypatch) -> None:
    monkeypatch.setitem(FAMILY_CONFIGS, "gpt_oss", {**FAMILY_CONFIGS["gpt_oss"], **RELEASED_ACTIVATION})


def test_float_gguf_converts_to_what_the_hf_checkpoint_does(released_activation: None, tmp_path: Path) -> None:
    """Split, transposed and renamed by llama.cpp, the experts come back as the HF converter's
    records bit for bit (gate rows, then up rows, biases alike), the config as it normalizes it."""
    src = save_checkpoint("gpt_oss", tmp_path / "hf", seed=1)
    path = export_gpt_oss_gguf(src, tmp_path / "model.gguf")
    with GGUFModel(path) as model:
        assert architecture_for(model).model_type == "gpt_oss"
    index = convert_gguf(path, tmp_path / "ftw")
    direct = convert_checkpoint(src, tmp_path / "ftw-hf")
    assert index.family == direct.family == "gpt_oss"
    for key in ("num_layers", "num_experts", "num_experts_per_tok", "moe_intermediate_size", "hidden_size",
                "head_dim", "moe_layers"):
        assert index.config[key] == direct.config[key], key
    assert {t.name for t in index.tensors} == {t.name for t in direct.tensors}
    ours, theirs = FTWReader.open(tmp_path / "ftw"), FTWReader.open(tmp_path / "ftw-hf")
    for a, b in zip(index.banks, direct.banks, strict=True):
        assert [(p.name, p.shape) for p in a.parts] == [(p.name, p.shape) for p in b.parts]
        assert a.activation == b.activation
    for t in index.tensors:
        assert torch.equal(ours.tensor(t.name).float(), theirs.tensor(t.name).float()), t.name
    for a, b in zip(index.banks, direct.banks, strict=True):
        mine, hf = ours.bank_bytes(a.layer), theirs.bank_bytes(b.layer)
        for e in range(a.num_experts):
            for part in ("w13", "w2", "w13_bias", "w2_bias"):
                assert torch.equal(ours.expert_part(mine, a, e, part).float(),
                                   theirs.expert_part(hf, b, e, part).float()), (a.layer, e, part)


def test_float_gguf_generates_what_transformers_does(released_activation: None, tmp_path: Path) -> None:
    from tests.test_parity import hf_model

    src = save_checkpoint("gpt_oss", tmp_path / "hf", seed=1)
    ours = convert_and_load(export_gpt_oss_gguf(src, tmp_path / "model.gguf"), tmp_path / "store")
    assert ours.config.get("layer_types") == ["sliding_attention", "full_attention", "sliding_attention"]
    assert_parity(ours, hf_model(src), PROMPT, STEPS)


def test_mxfp4_gguf_keeps_the_blocks_and_generates_what_transformers_does(released_activation: None,
                                                                          tmp_path: Path) -> None:
    """As released: MXFP4 experts, repacked by llama.cpp. ft keeps them as `mxfp4` records (17
    bytes per 32 values) and they compute what transformers' dequantized MXFP4 does."""
    from transformers import AutoModelForCausalLM, Mxfp4Config

    src = to_mxfp4(save_checkpoint("gpt_oss", tmp_path / "hf", seed=1), tmp_path / "mxfp4")
    path = export_gpt_oss_gguf(src, tmp_path / "model.gguf")
    ours = convert_and_load(path, tmp_path / "store")
    for bank in ours.weights.banks.values():
        assert bank.layout.part("w13").dtype == bank.layout.part("w2").dtype == "mxfp4"
    ref = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32,
                                               quantization_config=Mxfp4Config(dequantize=True)).eval()
    assert_parity(ours, ref, PROMPT, STEPS)
