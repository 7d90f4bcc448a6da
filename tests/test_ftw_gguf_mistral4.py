"""Mistral Small 4 (mistral4) as a GGUF file, written the way llama.cpp's converter writes it
(conversion/mistral3.py at llama.cpp 0c1e570: Mistral3Model hands a mistral4 text config to
Mistral4Model over DeepseekV2Model), pulled through ft and run against transformers.

`export_mistral4_gguf` follows that converter: the text config laid over the top level, the base keys
(YaRN's type, factor, original context and betas; key_length/value_length from head_dim, then
overwritten), DeepseekV2Model's (head_count_kv 1, leading_dense_block_count, vocab_size, the LoRA ranks,
the MLA lengths, expert widths and counts, expert_weights_scale, expert_weights_norm where true,
rope.dimension_count, yarn_log_multiplier 0.1 * mscale_all_dim; no expert_gating_func: Mistral4Config has
no scoring_func, so llama.cpp routes by softmax; no temperature key); `language_model.` dropped, the
vision tower and projector left out, kv_b_proj split into attn_k_b (transposed per head) and attn_v_b,
the fused experts kept fused (`.weight` appended: ffn_gate_up_exps, ffn_down_exps); a tekken byte-level
vocabulary padded, with the release's unk/bos/eos/pad ids 0, 1, 2 and 11.

llama.cpp runs these files without the query temperature and with YaRN's mscale 1: the parity checkpoint
has beta 0 and mscale 1, on which transformers agrees; a file with the temperature keys (as Mistral's own
format converter writes them) runs the stock checkpoint's stepping temperature.
"""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import pytest
import torch
from gguf.constants import MODEL_ARCH

from ftw import convert_checkpoint
from ftw.errors import UnsupportedArchitectureError
from ftw.gguf_convert import convert_gguf
from tests import checkpoints
from tests.checkpoints import load_all, save_checkpoint
from tests.gguf_export import (
    add_base_keys,
    add_deepseek2_keys,
    add_padded_vocab,
    add_yarn_keys,
    config_differences,
)
from tests.parity import assert_parity, convert_and_load
from tests.test_ftw_convert import assert_round_trip
from tests.test_ftw_gguf_hf import _gguf_name, write_gguf
from tests.test_parity import PROMPT, STEPS, hf_model

pytest.importorskip("transformers")

# what llama.cpp's graph runs a file of this converter with: no temperature, YaRN's mscale 1
AS_LLAMA_CPP = dict(llama_4_scaling_beta=0.0, mscale=1.0)


def export_mistral4_gguf(src: Path, out: Path, *, temperature: bool = False, log_mul: float | None = None,
                         extra: dict[str, torch.Tensor] | None = None, mistral_format: bool = False) -> Path:
    """The file Mistral4Model writes; `temperature` adds attention.temperature_scale/_length as
    MistralMoeModel writes them, `log_mul` another yarn_log_multiplier, `extra` further tensors.
    `mistral_format`: MistralMoeModel's file from the same weights (conversion/mistral.py, from Mistral's
    own format): deepseek2, expert_gating_func softmax, the temperature keys, the experts merged per
    layer by DeepseekV2Model into ffn_gate_exps/ffn_up_exps/ffn_down_exps."""
    arch = MODEL_ARCH.DEEPSEEK2 if mistral_format else MODEL_ARCH.MISTRAL4
    temperature = temperature or mistral_format
    top = json.loads((src / "config.json").read_text())
    c = {**top, **top["text_config"]}  # (TextModel.__init__)
    rope = c["rope_parameters"]
    w = gguf.GGUFWriter(out, gguf.MODEL_ARCH_NAMES[arch])
    if mistral_format:
        w.add_expert_gating_func(gguf.ExpertGatingFuncType.SOFTMAX)  # (its scoring_func "softmax")
    add_base_keys(w, {**c, "num_key_value_heads": 1})  # (DeepseekV2Model sets 1 before the base's keys)
    add_yarn_keys(w, rope)
    add_deepseek2_keys(w, c)
    w.add_rope_scaling_yarn_log_mul(log_mul if log_mul is not None else 0.1 * rope["mscale_all_dim"])
    if temperature:
        w.add_attn_temperature_scale(rope["llama_4_scaling_beta"])
        w.add_attn_temperature_length(rope["original_max_position_embeddings"])
    add_padded_vocab(w, c["vocab_size"], "tekken", unk=0, bos=c["bos_token_id"], eos=c["eos_token_id"],
                     pad=c["pad_token_id"])
    maps = [gguf.get_tensor_name_map(arch, c["num_hidden_layers"])]
    heads, nope, v_dim = c["num_attention_heads"], c["qk_nope_head_dim"], c["v_head_dim"]
    for name, t in {**load_all(src), **(extra or {})}.items():
        if "vision_" in name or "projector." in name:
            continue  # (TextModel.filter_tensors: the mmproj file's)
        name, t = name.replace("language_model.", ""), t.float()
        if name.endswith(".gate_up_proj") and mistral_format:  # (stacked per expert from w1 and w3)
            for part, data in zip(("gate_proj", "up_proj"), t.chunk(2, dim=1), strict=True):
                w.add_tensor(_gguf_name(maps, name.replace("gate_up_proj", part) + ".weight"), data.contiguous().numpy())
            continue
        if name.endswith((".down_proj", ".gate_up_proj")):
            name += ".weight"  # (Mistral4Model: already stacked, [E, 2I, H] and [E, H, I])
        if name.endswith("kv_b_proj.weight"):
            k_b, v_b = t.view(heads, nope + v_dim, t.shape[-1]).split([nope, v_dim], dim=1)
            for half, data in (("k_b_proj", k_b.transpose(1, 2)), ("v_b_proj", v_b)):
                w.add_tensor(_gguf_name(maps, name.replace("kv_b_proj", half)), data.contiguous().numpy())
            continue
        w.add_tensor(_gguf_name(maps, name), t.contiguous().numpy())
    return write_gguf(w, out)


@pytest.fixture
def as_llama_cpp(monkeypatch) -> None:
    text = checkpoints.MISTRAL4_TEXT
    monkeypatch.setattr(checkpoints, "MISTRAL4_TEXT", {**text, "rope_parameters": {**text["rope_parameters"], **AS_LLAMA_CPP}})


@pytest.fixture
def mscale_one(monkeypatch) -> None:
    text = checkpoints.MISTRAL4_TEXT
    monkeypatch.setattr(checkpoints, "MISTRAL4_TEXT", {**text, "rope_parameters": {**text["rope_parameters"], "mscale": 1.0}})


def test_mistral4_gguf_generates_what_transformers_does(tmp_path: Path, as_llama_cpp) -> None:
    src = save_checkpoint("mistral4", tmp_path / "hf", seed=1)
    ours = convert_and_load(export_mistral4_gguf(src, tmp_path / "model.gguf"), tmp_path / "store")
    assert "llama_4_scaling_beta" not in ours.config.rope_parameters  # (the file has no temperature)
    assert_parity(ours, hf_model(src), PROMPT, STEPS)


def test_mistral4_gguf_with_the_temperature_keys_steps_it(tmp_path: Path, mscale_one) -> None:
    """attention.temperature_scale and _length (MistralMoeModel's keys; llama.cpp's deepseek2 graph applies
    them to the whole query): the checkpoint's beta 0.5, stepping at 16 and 32 within the 44 positions."""
    src = save_checkpoint("mistral4", tmp_path / "hf", seed=2)
    ours = convert_and_load(export_mistral4_gguf(src, tmp_path / "model.gguf", temperature=True), tmp_path / "store")
    assert ours.config.rope_parameters["llama_4_scaling_beta"] == 0.5
    assert_parity(ours, hf_model(src), PROMPT, STEPS)


def test_mistral_format_deepseek2_gguf_runs_as_mistral4(tmp_path: Path, mscale_one) -> None:
    """Mistral's own-format converter writes Mistral Small 4 as deepseek2 with the temperature keys: ft runs
    it as mistral4 (a deepseek_v2 config would drop the temperature and score groups by their best expert)."""
    src = save_checkpoint("mistral4", tmp_path / "hf", seed=3)
    path = export_mistral4_gguf(src, tmp_path / "model.gguf", mistral_format=True)
    ours = convert_and_load(path, tmp_path / "store")
    assert ours.config.get("model_type") == "mistral4"
    assert_parity(ours, hf_model(src), PROMPT, STEPS)


def test_mistral4_gguf_config_and_tensors_are_the_checkpoints(tmp_path: Path, as_llama_cpp) -> None:
    """The FTW config is the checkpoint's but for the model type (the file holds the text model, mistral4,
    where the checkpoint is its mistral3 wrapper) and every text tensor is, bit for bit (kv_b_proj rebuilt
    from its halves, the experts' bank from the fused tensors); the source config is its text config but for
    what the file does not carry: the temperature's beta (0 here: none), partial_rotary_factor (implied by
    the rope dimension) and rope's max_position_embeddings."""
    src = save_checkpoint("mistral4", tmp_path / "hf")
    top = json.loads((src / "config.json").read_text())
    direct = convert_checkpoint(src, tmp_path / "ftw-hf")
    index = convert_gguf(export_mistral4_gguf(src, tmp_path / "model.gguf"), tmp_path / "ftw")
    assert index.family == "mistral4"
    assert {**index.config, "model_type": "mistral3"} == direct.config
    text = top["text_config"]
    differences = config_differences(index.source_config, text)
    rope, want = differences.pop("rope_parameters"), text["rope_parameters"]
    assert differences == {}
    assert rope[0] == {k: v for k, v in want.items()
                       if k not in ("llama_4_scaling_beta", "partial_rotary_factor", "max_position_embeddings")}
    assert {t.name for t in index.tensors} == {t.name for t in direct.tensors}
    assert_round_trip(src, tmp_path / "ftw")  # every text tensor back under its HF name, bit for bit


def test_mistral4_gguf_refuses_what_llama_cpp_runs_otherwise(tmp_path: Path) -> None:
    """A routing bias (gguf-py's table allows exp_probs_b, transformers' Mistral 4 has none), sigmoid
    gating, YaRN with mscale_all_dim other than 1 (llama.cpp then scales the softmax unlike transformers),
    and a temperature stepping otherwise than rope's original context are refused."""
    src = save_checkpoint("mistral4", tmp_path / "hf")
    # (ModelBase.filter_tensors renames e_score_correction_bias so gguf-py's table finds it)
    bias = {"language_model.model.layers.1.mlp.gate.e_score_correction.bias": torch.zeros(8)}
    cases = [
        ("bias", dict(extra=bias), "routing bias"),
        ("log-mul", dict(log_mul=0.2), "yarn_log_multiplier 0.2"),
    ]
    for label, kwargs, match in cases:
        with pytest.raises(UnsupportedArchitectureError, match=match):
            convert_gguf(export_mistral4_gguf(src, tmp_path / f"{label}.gguf", **kwargs), tmp_path / f"ftw-{label}")
    for label, key, value, match in (("sigmoid", "expert_gating_func", 2, "expert_gating_func 2"),
                                     ("length", "attention.temperature_length", 8, "every 8 positions")):
        path = export_mistral4_gguf(src, tmp_path / f"{label}-base.gguf", temperature=True)
        with pytest.raises(UnsupportedArchitectureError, match=match):
            convert_gguf(_with_key(path, tmp_path / f"{label}.gguf", key, value), tmp_path / f"ftw-{label}")


def _with_key(path: Path, out: Path, key: str, value: int) -> Path:
    """`path` rewritten with the uint32 `mistral4.<key>` set to `value`."""
    reader = gguf.GGUFReader(path)
    w = gguf.GGUFWriter(out, "mistral4")
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name in ("general.architecture", f"mistral4.{key}"):
            continue
        value_type = field.types[0]
        if value_type == gguf.GGUFValueType.ARRAY:
            w.add_array(field.name, field.contents())
        else:
            w.add_key_value(field.name, field.contents(), value_type)
    w.add_uint32(f"mistral4.{key}", value)
    for t in reader.tensors:
        w.add_tensor(t.name, t.data.reshape([int(d) for d in reversed(t.shape)]))
    return write_gguf(w, out)
