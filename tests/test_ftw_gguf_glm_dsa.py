"""GLM-5 (glm_moe_dsa) as a GGUF file (`glm-dsa`), written the way llama.cpp's converter writes it
(conversion/glm.py at llama.cpp 0c1e570: GlmMoeDsaModel over DeepseekV2Model), pulled through ft and run
against transformers.

`export_glm_dsa_gguf` follows that converter: the base keys (key_length/value_length from head_dim, which
GlmMoeDsaConfig points at qk_rope_head_dim, then overwritten; expert_group_count/_used_count from n_group and
topk_group; no expert_gating_func: the config has no scoring_func, and glm-dsa's loader then routes by
sigmoid), DeepseekV2Model's (head_count_kv 1, leading_dense_block_count, vocab_size, the LoRA ranks, the MLA
lengths, expert widths and counts, expert_weights_scale, expert_weights_norm where true, rope.dimension_count,
yarn_log_multiplier 0.1 * mscale_all_dim where the config has it), GlmMoeDsaModel's (rope.dimension_count
again, nextn_predict_layers where the config has them, the indexer's head count, key length, top-k and types,
one bool a layer, true for "full"); kv_b_proj split into attn_k_b (transposed per head) and attn_v_b, the
experts stacked per layer, the correction bias renamed so gguf-py's table finds it; a glm4 byte-level vocabulary
padded (_set_vocab_glm's bos, eos and unk).

llama.cpp's glm-dsa reads no yarn_log_multiplier: with YaRN it scales cos/sin by get_mscale(factor) and the
softmax by its square, transformers' YaRN with mscale_all_dim 1 and no mscale, which the YaRN test's
checkpoint has.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import gguf
import pytest
import torch
from gguf.constants import MODEL_ARCH

from ftw import convert_checkpoint
from ftw.errors import UnsupportedArchitectureError
from ftw.gguf_config_more import GLM_5_2_INDEXER_TABLE
from ftw.gguf_convert import convert_gguf
from tests.checkpoints import load_all
from tests.gguf_export import (
    add_base_keys,
    add_deepseek2_keys,
    add_padded_vocab,
    add_yarn_keys,
    config_differences,
)
from tests.parity import assert_parity, convert_and_load
from tests.test_ftw_convert import assert_round_trip
from tests.test_ftw_gguf_hf import add_deepseek2_tensors, with_nextn_block, write_gguf
from tests.test_parity_deepseek import CONFIGS, PROMPT, STEPS, hf_model

pytest.importorskip("transformers")

ARCH = gguf.MODEL_ARCH_NAMES[MODEL_ARCH.GLM_DSA]
# YaRN as llama.cpp's glm-dsa runs it (mscale_all_dim 1, no mscale): 8 times 64 positions
YARN = dict(rope_type="yarn", rope_theta=10000.0, factor=8.0, mscale_all_dim=1.0,
            original_max_position_embeddings=64, beta_fast=32, beta_slow=1)


def save_glm(out: Path, *, seed: int = 1, **overrides) -> Path:
    """test_parity_deepseek's "glm" checkpoint (4 layers, layer 2 sharing layer 1's selection, 6 of up to 44
    tokens a query, two groups of four experts keeping one, a correction bias mostly negative, random norms)
    with `overrides`, as save_pretrained writes it (per-expert)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    family, config = copy.deepcopy(CONFIGS["glm"])
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(family, **{**config, **overrides}))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_((1.0 if name.endswith("weight") else 0.0) + 0.2 * torch.randn_like(p))
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(0.6 * torch.randn_like(b) - 0.6)
    model.save_pretrained(out)
    return out


def export_glm_dsa_gguf(src: Path, out: Path, *, indexer_types: bool = True, context: int | None = None,
                        mtp: bool = False, keys: dict | None = None) -> Path:
    """The file GlmMoeDsaModel writes from `src`; without `indexer_types`, as written from a config without
    them (older converters' transformers); `context` another context_length; `mtp`, a NextN block after
    the last layer (block_count one more, nextn_predict_layers 1); `keys` further uint32 keys."""
    c = json.loads((src / "config.json").read_text())
    rope, layers = c["rope_parameters"], c["num_hidden_layers"]
    w = gguf.GGUFWriter(out, ARCH)
    add_base_keys(w, {**c, "num_key_value_heads": 1, "max_position_embeddings": context or c["max_position_embeddings"]},
                  block_count=layers + mtp)
    if rope["rope_type"] == "yarn":  # (the base's)
        add_yarn_keys(w, rope)
    add_deepseek2_keys(w, c)
    if "mscale_all_dim" in rope:
        w.add_rope_scaling_yarn_log_mul(0.1 * rope["mscale_all_dim"])
    if mtp:  # (GlmMoeDsaModel's from here)
        w.add_nextn_predict_layers(1)
    w.add_indexer_head_count(c["index_n_heads"])
    w.add_indexer_key_length(c["index_head_dim"])
    w.add_indexer_top_k(c["index_topk"])
    if indexer_types:
        w.add_array(f"{ARCH}.attention.indexer.types", [t == "full" for t in c["indexer_types"]])
    for key, value in (keys or {}).items():
        w.add_uint32(f"{ARCH}.{key}", value)
    add_padded_vocab(w, c["vocab_size"], "glm4", bos=c["bos_token_id"], eos=c["eos_token_id"], unk=2)
    maps = [gguf.get_tensor_name_map(MODEL_ARCH.GLM_DSA, layers + mtp)]
    tensors = load_all(src)
    add_deepseek2_tensors(w, maps, c, with_nextn_block(tensors, c, layers) if mtp else tensors)
    return write_gguf(w, out)


@pytest.mark.parametrize("mtp", [False, True], ids=["plain", "nextn"])
def test_glm_dsa_gguf_generates_what_transformers_does(tmp_path: Path, mtp: bool) -> None:
    src = save_glm(tmp_path / "hf")
    path = export_glm_dsa_gguf(src, tmp_path / "model.gguf", mtp=mtp)
    ours = convert_and_load(path, tmp_path / "store")
    assert ours.config.get("indexer_types") == ["full", "full", "shared", "full"]
    assert_parity(ours, hf_model(src), PROMPT, STEPS)


def test_glm_dsa_gguf_with_yarn(tmp_path: Path) -> None:
    """YaRN (8 x 64 positions): llama.cpp's glm-dsa scales cos/sin by get_mscale(8) and the softmax by its
    square whatever the yarn_log_multiplier, transformers' YaRN with mscale_all_dim 1 and no mscale."""
    src = save_glm(tmp_path / "hf", rope_parameters=YARN, max_position_embeddings=512)
    ours = convert_and_load(export_glm_dsa_gguf(src, tmp_path / "model.gguf"), tmp_path / "store")
    assert_parity(ours, hf_model(src), PROMPT, STEPS)


def test_glm_dsa_gguf_without_indexer_types(tmp_path: Path) -> None:
    """A file without attention.indexer.types: every layer full under a 2^20 context (GLM-5, 5.1), as
    llama.cpp's loader fills them and as transformers' GlmMoeDsaConfig derives them by default; GLM-5.2's
    table (full on 0, 1 and every fourth from 2) from a context of 2^20."""
    src = save_glm(tmp_path / "hf", indexer_types=None)
    ours = convert_and_load(export_glm_dsa_gguf(src, tmp_path / "model.gguf", indexer_types=False), tmp_path / "store")
    assert ours.config.get("indexer_types") == ["full"] * 4
    assert_parity(ours, hf_model(src), PROMPT, STEPS)
    index = convert_gguf(export_glm_dsa_gguf(src, tmp_path / "long.gguf", indexer_types=False, context=1 << 20),
                         tmp_path / "ftw-long")
    assert index.source_config["indexer_types"] == ["full", "full", "full", "shared"]
    assert GLM_5_2_INDEXER_TABLE[:10] == [True, True, True, False, False, False, True, False, False, False]


def test_glm_dsa_gguf_config_and_tensors_are_the_checkpoints(tmp_path: Path) -> None:
    """The FTW config is the HF path's and every tensor and expert bank is the checkpoint's, bit for bit
    (kv_b_proj rebuilt from its halves, the banks from the stacked experts); the source config is the
    checkpoint's but for what the file does not carry."""
    src = save_glm(tmp_path / "hf")
    direct = convert_checkpoint(src, tmp_path / "ftw-hf")
    index = convert_gguf(export_glm_dsa_gguf(src, tmp_path / "model.gguf", mtp=True), tmp_path / "ftw")
    assert index.family == direct.family == "glm_moe_dsa"
    assert index.config == direct.config
    assert index.metadata["dropped_tensors"] > 0  # (the NextN block)
    differences = config_differences(index.source_config, json.loads((src / "config.json").read_text()))
    assert differences == {"num_key_value_heads": (4, 4)} or differences == {}, differences
    assert {t.name for t in index.tensors} == {t.name for t in direct.tensors}
    assert [(b.layer, [(p.name, p.dtype, p.shape) for p in b.parts]) for b in index.banks] == \
        [(b.layer, [(p.name, p.dtype, p.shape) for p in b.parts]) for b in direct.banks]
    assert_round_trip(src, tmp_path / "ftw")


def test_glm_dsa_gguf_refuses_what_llama_cpp_runs_otherwise(tmp_path: Path) -> None:
    """Softmax gating (GLM-5 routes by sigmoid), a yarn_log_multiplier other than 0.1 (llama.cpp ignores it,
    transformers' softmax scale follows it) and a first layer sharing a selection (llama.cpp asserts)."""
    src = save_glm(tmp_path / "hf")
    path = export_glm_dsa_gguf(src, tmp_path / "softmax.gguf", keys={"expert_gating_func": 1})
    with pytest.raises(UnsupportedArchitectureError, match="expert_gating_func 1"):
        convert_gguf(path, tmp_path / "ftw-softmax")
    yarn = save_glm(tmp_path / "hf-yarn", rope_parameters={**YARN, "mscale_all_dim": 0.7}, max_position_embeddings=512)
    with pytest.raises(UnsupportedArchitectureError, match="yarn_log_multiplier"):
        convert_gguf(export_glm_dsa_gguf(yarn, tmp_path / "yarn.gguf"), tmp_path / "ftw-yarn")
    shared = save_glm(tmp_path / "hf-shared", indexer_types=["full"] * 4)
    c = json.loads((shared / "config.json").read_text())
    (shared / "config.json").write_text(json.dumps({**c, "indexer_types": ["shared", "full", "full", "full"]}))
    with pytest.raises(UnsupportedArchitectureError, match="first layer shares"):
        convert_gguf(export_glm_dsa_gguf(shared, tmp_path / "shared.gguf"), tmp_path / "ftw-shared")
