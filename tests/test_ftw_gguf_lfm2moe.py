"""LFM2-MoE (lfm2_moe) as a GGUF file (`lfm2moe`), written the way llama.cpp's converter writes it
(conversion/lfm2.py, LFM2MoeModel, at llama.cpp 0c1e570), pulled through ft and run against
transformers.

`export_lfm2moe_gguf` follows that converter: head_count_kv one a layer, 0 on the convolution
layers; the base keys (the rms eps from norm_eps, feed_forward_length the dense layer's width),
expert_feed_forward_length, leading_dense_block_count, expert_gating_func sigmoid,
shortconv.l_cache; the convolution kernel squeezed to [C, K], the expert bias renamed
expert_bias.bias, the experts stacked under `layers.N.feed_forward.experts.wK.weight`, gguf-py's
names for the rest; the vocabulary padded with [PAD] tokens, pre-tokenizer "lfm2".

llama.cpp's lfm2moe graph scales the routed weights by nothing (no key carries
routed_scaling_factor), so the parity checkpoint has Lfm2MoeConfig's routed_scaling_factor 1; the
tiny model of tests/checkpoints.py (2.0) exported as a GGUF reads as llama.cpp runs it, 1.
"""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import pytest
import torch
from gguf.constants import MODEL_ARCH

from ftw import convert_checkpoint
from ftw.gguf_convert import convert_gguf
from tests.checkpoints import FAMILY_CONFIGS, RANDOMIZED, load_all, save_checkpoint
from tests.gguf_export import add_base_keys, add_padded_vocab, config_differences
from tests.parity import assert_parity, convert_and_load
from tests.test_ftw_convert import assert_round_trip
from tests.test_ftw_gguf_hf import _gguf_name, write_gguf
from tests.test_parity import PROMPT, STEPS, hf_model

pytest.importorskip("transformers")


def export_lfm2moe_gguf(src: Path, out: Path) -> Path:
    c = json.loads((src / "config.json").read_text())
    layers = c["num_hidden_layers"]
    w = gguf.GGUFWriter(out, "lfm2moe")
    kv = [c["num_key_value_heads"] if t == "full_attention" else 0 for t in c["layer_types"]]
    add_base_keys(w, {**c, "num_key_value_heads": kv})
    w.add_expert_feed_forward_length(c["moe_intermediate_size"])  # (LFM2MoeModel's)
    w.add_leading_dense_block_count(c["num_dense_layers"])
    w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
    w.add_vocab_size(c["vocab_size"])
    w.add_shortconv_l_cache(c["conv_L_cache"])
    add_padded_vocab(w, c["vocab_size"], "lfm2", bos=c["bos_token_id"], eos=c["eos_token_id"])
    maps = [gguf.get_tensor_name_map(MODEL_ARCH.LFM2MOE, layers)]
    experts: dict[tuple[int, str], dict[int, torch.Tensor]] = {}
    for name, t in load_all(src).items():
        t = t.float()
        if "conv.conv" in name:
            t = t.squeeze(1)
        if ".feed_forward.experts." in name:  # model.layers.L.feed_forward.experts.E.wK.weight
            parts = name.split(".")
            experts.setdefault((int(parts[2]), parts[6]), {})[int(parts[5])] = t
            continue
        name = name.replace(".expert_bias", ".expert_bias.bias")
        w.add_tensor(_gguf_name(maps, name), t.contiguous().numpy())
    for (layer, proj), by_expert in sorted(experts.items()):
        stacked = torch.stack([by_expert[e] for e in range(len(by_expert))])
        w.add_tensor(_gguf_name(maps, f"layers.{layer}.feed_forward.experts.{proj}.weight"), stacked.contiguous().numpy())
    return write_gguf(w, out)


def _unscaled_checkpoint(out: Path, seed: int) -> Path:
    """tests/checkpoints.py's tiny LFM2-MoE with routed_scaling_factor 1 (Lfm2MoeConfig's, llama.cpp's)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(
        AutoConfig.for_model("lfm2_moe", **{**FAMILY_CONFIGS["lfm2_moe"], "routed_scaling_factor": 1.0}))
    with torch.no_grad():
        for name, p in [*model.named_parameters(), *model.named_buffers()]:
            if any(part in name for part in RANDOMIZED["lfm2_moe"]):
                p.normal_(0.0 if name.endswith(".bias") else 1.0, 0.2)
    model.save_pretrained(out)
    return out


def test_lfm2moe_gguf_generates_what_transformers_does(tmp_path: Path) -> None:
    src = _unscaled_checkpoint(tmp_path / "hf", seed=1)
    ours = convert_and_load(export_lfm2moe_gguf(src, tmp_path / "model.gguf"), tmp_path / "store")
    assert_parity(ours, hf_model(src), PROMPT, STEPS)


def test_lfm2moe_gguf_config_is_the_checkpoints(tmp_path: Path) -> None:
    """The FTW config and tensors from the GGUF are those from the Hugging Face checkpoint (the layer
    kinds from head_count_kv, the dense first layer, the kernel back to [C, 1, K], the eps), but
    routed_scaling_factor, which llama.cpp leaves at 1."""
    src = save_checkpoint("lfm2_moe", tmp_path / "hf")
    direct = convert_checkpoint(src, tmp_path / "ftw-hf")
    index = convert_gguf(export_lfm2moe_gguf(src, tmp_path / "model.gguf"), tmp_path / "ftw")
    assert index.config == direct.config
    hf_config = json.loads((src / "config.json").read_text())
    assert config_differences(index.source_config, hf_config) == {"routed_scaling_factor": (1.0, 2.0)}
    assert {t.name for t in index.tensors} == {t.name for t in direct.tensors}
    assert_round_trip(src, tmp_path / "ftw")  # every tensor back under its HF name, bit for bit
