"""Upstage's Solar Open (solar_open) as a GGUF file (`glm4moe`), written the way llama.cpp's converter writes
it (conversion/glm.py, SolarOpenModel over Glm4MoeModel and TextModel, at llama.cpp 0c1e570), pulled through
ft and run against transformers.

`export_solar_open_gguf` follows that converter: the base keys (find_hparam's: feed_forward_length only where
the config has an intermediate_size, which SolarOpenConfig does not; the group keys from n_group and
topk_group; key_length from head_dim; YaRN's from rope_parameters), then Glm4MoeModel's: rope.dimension_count
head_dim times partial_rotary_factor (0.5 where the rope parameters name none), expert_count,
expert_feed_forward_length, expert_shared_count, leading_dense_block_count where first_k_dense_replace is
(SolarOpenConfig saves none), sigmoid gating, expert_weights_scale and _norm; no MTP (supports_mtp_export
False); then SolarOpenModel.set_vocab's byte-level vocabulary with the "solar-open" pre-tokenizer, eos and eot
<|endoftext|>, bos <|startoftext|>, unk <unk>. The experts are stacked, nothing permuted (glm4moe rotates
NeoX halves, as Llama's attention in transformers does), e_score_correction_bias renamed as llama.cpp does;
the names from gguf-py's GLM4_MOE table. The file is told from GLM-4.5's by its pre-tokenizer.
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

BOS, EOS, UNK = 1, 2, 0  # <|startoftext|>, <|endoftext|>, <unk>
WHOLE = {"rope_type": "default", "rope_theta": 1_000_000.0, "partial_rotary_factor": 1.0}  # the release's rotation
YARN = {"rope_type": "yarn", "rope_theta": 1_000_000.0, "partial_rotary_factor": 1.0, "factor": 2.0,
        "original_max_position_embeddings": 64, "beta_fast": 32.0, "beta_slow": 1.0}


def save_solar_open(out: Path, monkeypatch: pytest.MonkeyPatch, **overrides) -> Path:
    """The parity test's solar_open checkpoint (q/k/v biases, two expert groups keeping one, scaled weights,
    two shared experts) rotating whole heads as the release does, its special ids in the vocabulary, with
    `overrides`."""
    config = {**FAMILY_CONFIGS["solar_open"], "rope_parameters": WHOLE, "bos_token_id": BOS, "eos_token_id": EOS}
    monkeypatch.setitem(FAMILY_CONFIGS, "solar_open", {**config, **overrides})
    return save_checkpoint("solar_open", out, seed=1)


def export_solar_open_gguf(src: Path, out: Path, *, keys: dict | None = None, pre: str = "solar-open") -> Path:
    """The file SolarOpenModel writes from `src`; `keys`, further uint32 keys; `pre`, another pre-tokenizer."""
    c = json.loads((src / "config.json").read_text())
    rope = c["rope_parameters"]
    layers = c["num_hidden_layers"]
    w = gguf.GGUFWriter(out, "glm4moe")
    w.add_block_count(layers)  # (the base's keys, as find_hparam finds them)
    w.add_context_length(c["max_position_embeddings"])
    w.add_embedding_length(c["hidden_size"])
    if "intermediate_size" in c:
        w.add_feed_forward_length(c["intermediate_size"])
    w.add_head_count(c["num_attention_heads"])
    w.add_head_count_kv(c["num_key_value_heads"])
    if rope["rope_type"] == "yarn":
        add_yarn_keys(w, rope)
    w.add_rope_freq_base(rope["rope_theta"])
    w.add_layer_norm_rms_eps(c["rms_norm_eps"])
    w.add_expert_count(c["n_routed_experts"])
    w.add_expert_used_count(c["num_experts_per_tok"])
    w.add_expert_group_count(c["n_group"])
    w.add_expert_group_used_count(c["topk_group"])
    w.add_key_length(c["head_dim"])
    w.add_value_length(c["head_dim"])
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_rope_dimension_count(int(c["head_dim"] * rope.get("partial_rotary_factor", 0.5)))  # (Glm4MoeModel's)
    w.add_expert_feed_forward_length(c["moe_intermediate_size"])
    w.add_expert_shared_count(c["n_shared_experts"])
    w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
    w.add_expert_weights_scale(c["routed_scaling_factor"])
    w.add_expert_weights_norm(c["norm_topk_prob"])
    for key, value in (keys or {}).items():
        w.add_uint32(f"glm4moe.{key}", value)
    add_padded_vocab(w, c["vocab_size"], pre, bos=c["bos_token_id"], eos=c["eos_token_id"], unk=UNK)
    w.add_eot_token_id(c["eos_token_id"])  # (SolarOpenModel.set_vocab: eot is <|endoftext|> too)
    maps = [gguf.get_tensor_name_map(MODEL_ARCH.GLM4_MOE, layers)]
    experts: dict = {}
    for name, t in load_all(src).items():
        if ".mlp.experts." in name:
            collect_expert(experts, name, t.float())
            continue
        name = name.replace("e_score_correction_bias", "e_score_correction.bias")  # (as llama.cpp does)
        w.add_tensor(_gguf_name(maps, name), t.float().contiguous().numpy())
    add_stacked_experts(w, maps, experts)
    return write_gguf(w, out)


@pytest.mark.parametrize("rope", [WHOLE, YARN], ids=["plain", "yarn"])
def test_solar_open_gguf_generates_what_transformers_does(tmp_path: Path, monkeypatch, rope: dict) -> None:
    src = save_solar_open(tmp_path / "hf", monkeypatch, rope_parameters=rope, max_position_embeddings=128)
    ours = convert_and_load(export_solar_open_gguf(src, tmp_path / "model.gguf"), tmp_path / "store")
    assert ours.config.get("model_type") == "solar_open"
    assert_parity(ours, hf_model(src), PROMPT, STEPS)


@pytest.mark.parametrize("rope", [WHOLE, YARN], ids=["plain", "yarn"])
def test_solar_open_gguf_config_is_the_checkpoints(tmp_path: Path, monkeypatch, rope: dict) -> None:
    """The glm4moe file with Solar Open's vocabulary is solar_open (not glm4_moe): the FTW config and tensors
    are the HF path's, the source config the checkpoint's (no first_k_dense_replace, use_qk_norm or
    intermediate_size, which SolarOpenConfig has not); every tensor back bit for bit."""
    src = save_solar_open(tmp_path / "hf", monkeypatch, rope_parameters=rope, max_position_embeddings=128)
    direct = convert_checkpoint(src, tmp_path / "ftw-hf")
    index = convert_gguf(export_solar_open_gguf(src, tmp_path / "model.gguf"), tmp_path / "ftw")
    assert index.family == direct.family == "solar_open"
    assert index.config == direct.config
    checkpoint = json.loads((src / "config.json").read_text())
    assert config_differences(index.source_config, checkpoint) == {}
    assert not {"first_k_dense_replace", "use_qk_norm", "intermediate_size"} & set(index.source_config)
    assert {t.name for t in index.tensors} == {t.name for t in direct.tensors}
    assert_round_trip(src, tmp_path / "ftw")


def test_solar_open_gguf_refusals(tmp_path: Path, monkeypatch) -> None:
    """What llama.cpp would run and transformers' Solar Open does not, refused by name: half of each head
    rotated (what SolarOpenModel writes from a config.json that names no partial_rotary_factor, as
    SolarOpenConfig's save_pretrained leaves it) and dense leading layers (SolarOpenConfig builds none)."""
    src = save_solar_open(tmp_path / "hf", monkeypatch, rope_parameters={"rope_type": "default", "rope_theta": 1e6})
    with pytest.raises(UnsupportedArchitectureError, match="rotating 8 of each head's 16 channels"):
        convert_gguf(export_solar_open_gguf(src, tmp_path / "half.gguf"), tmp_path / "ftw-half")
    src = save_solar_open(tmp_path / "hf2", monkeypatch)
    with pytest.raises(UnsupportedArchitectureError, match="experts on every layer"):
        convert_gguf(export_solar_open_gguf(src, tmp_path / "dense.gguf", keys={"leading_dense_block_count": 1}),
                     tmp_path / "ftw-dense")


def test_glm4moe_gguf_without_solar_vocabulary_stays_glm4_moe(tmp_path: Path, monkeypatch) -> None:
    """Only the pre-tokenizer tells the two apart: the same file with GLM-4.5's ("glm4", and the
    feed_forward_length its config has) is read as glm4_moe."""
    src = save_solar_open(tmp_path / "hf", monkeypatch)
    path = export_solar_open_gguf(src, tmp_path / "glm.gguf", pre="glm4", keys={"feed_forward_length": 128})
    assert convert_gguf(path, tmp_path / "ftw").family == "glm4_moe"
