"""AI21 Jamba (jamba) as a GGUF file (`jamba`), written the way llama.cpp's converter writes it
(conversion/jamba.py, JambaModel, at llama.cpp 0c1e570), pulled through ft and run against transformers.

`export_jamba_gguf` follows that converter: its own keys (no base ones: block_count, context_length,
embedding_length, feed_forward_length, head_count, head_count_kv one a layer from attn_layer_period
and _offset, 0 on the Mamba layers, the ssm keys conv_kernel, inner_size = mamba_expand x hidden,
state_size, time_step_rank = mamba_dt_rank, the rms eps, expert_count and expert_used_count); on the
Mamba layers the conv squeezed to [I, K] and A_log as -exp(A_log), everything else as it is; the
per-expert tensors stacked under the names qwen2moe's merged ones get (ffn_*_exps); a SentencePiece
vocabulary ("llama", _set_vocab_sentencepiece) padded with [PAD<i>] tokens.
"""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import pytest
import torch
from gguf.constants import MODEL_ARCH

from ftw import FTWReader, convert_checkpoint
from ftw.errors import UnsupportedArchitectureError
from ftw.gguf_config_layered import _period_and_offset
from ftw.gguf_convert import convert_gguf
from runtime.models.jamba import layer_kinds
from tests.checkpoints import load_all, save_checkpoint
from tests.gguf_export import config_differences
from tests.gguf_vocab import UNUSED
from tests.parity import assert_parity, convert_and_load
from tests.test_ftw_gguf_hf import _gguf_name, add_stacked_experts, collect_expert, write_gguf
from tests.test_ftw_gguf_phimoe import PIECES
from tests.test_parity import PROMPT, STEPS, hf_model

pytest.importorskip("transformers")


def export_jamba_gguf(src: Path, out: Path, *, kv_heads: list[int] | None = None) -> Path:
    """`src` as JambaModel writes it; `kv_heads` overrides head_count_kv (a layout no period makes)."""
    c = json.loads((src / "config.json").read_text())
    layers, hidden, vocab = c["num_hidden_layers"], c["hidden_size"], c["vocab_size"]
    period, offset = c.get("attn_layer_period", 8), c.get("attn_layer_offset", 4)
    w = gguf.GGUFWriter(out, "jamba")
    w.add_block_count(layers)  # JambaModel.set_gguf_parameters
    w.add_context_length(c["max_position_embeddings"])
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(c["intermediate_size"])
    w.add_head_count(c["num_attention_heads"])
    w.add_head_count_kv(kv_heads or [c["num_key_value_heads"] if i >= offset and (i - offset) % period == 0 else 0
                                     for i in range(layers)])
    w.add_ssm_conv_kernel(c["mamba_d_conv"])
    w.add_ssm_inner_size(c["mamba_expand"] * hidden)
    w.add_ssm_state_size(c["mamba_d_state"])
    w.add_ssm_time_step_rank(c["mamba_dt_rank"])
    w.add_layer_norm_rms_eps(c["rms_norm_eps"])
    w.add_expert_count(c["num_experts"])
    w.add_expert_used_count(c["num_experts_per_tok"])
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    tokens, types, scores = [f"[PAD{i}]" for i in range(vocab)], [UNUSED] * vocab, [-10000.0] * vocab
    for i, (piece, kind) in enumerate(PIECES):  # _create_vocab_sentencepiece: the pieces over the padding
        tokens[i], types[i], scores[i] = piece, kind, -float(i)
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(c["bos_token_id"])
    w.add_eos_token_id(c["eos_token_id"])
    w.add_unk_token_id(0)
    w.add_chat_template("{{ messages[0]['content'] }}")
    maps = [gguf.get_tensor_name_map(MODEL_ARCH.JAMBA, layers)]
    experts: dict = {}
    for name, t in load_all(src).items():
        t = t.float()
        if ".feed_forward.experts." in name:
            collect_expert(experts, name, t)
            continue
        if name.endswith("conv1d.weight"):  # JambaModel.modify_tensors
            t = t.squeeze()
        elif name.endswith(".A_log"):
            t = -torch.exp(t)
        w.add_tensor(_gguf_name(maps, name), t.contiguous().numpy())
    add_stacked_experts(w, maps, experts)  # (JambaModel's mlp.experts.* and these both name ffn_*_exps)
    return write_gguf(w, out)


def test_jamba_gguf_generates_what_transformers_does(tmp_path: Path) -> None:
    """The tiny checkpoint (attention on 1 and 4, the MoE on 1 and 3) from its GGUF file: logits to
    1e-4 in f32, 32 greedy tokens, cached decode = recompute."""
    src = save_checkpoint("jamba", tmp_path / "hf", seed=1)
    ours = convert_and_load(export_jamba_gguf(src, tmp_path / "model.gguf"), tmp_path / "store")
    assert_parity(ours, hf_model(src), PROMPT, STEPS)


def test_jamba_gguf_config_and_tensors_are_the_checkpoints(tmp_path: Path) -> None:
    """The source and FTW configs from the GGUF are the HF checkpoint's (the periods and offsets read
    back from head_count_kv and the expert tensors); every tensor is the checkpoint's bit for bit, D
    too, A_log (log(exp(A_log)) in float32) to a rounding; the expert banks are the same bytes."""
    src = save_checkpoint("jamba", tmp_path / "hf")
    direct = convert_checkpoint(src, tmp_path / "ftw-hf")
    index = convert_gguf(export_jamba_gguf(src, tmp_path / "model.gguf"), tmp_path / "ftw")
    assert config_differences(index.source_config, json.loads((src / "config.json").read_text())) == {}
    assert config_differences(index.config, direct.config) == {}
    assert {t.name for t in index.tensors} == {t.name for t in direct.tensors}
    ours, theirs = FTWReader.open(tmp_path / "ftw"), FTWReader.open(tmp_path / "ftw-hf")
    assert [b.layer for b in index.banks] == [b.layer for b in direct.banks] == [1, 3]
    for b in direct.banks:
        assert torch.equal(ours.bank_bytes(b.layer), theirs.bank_bytes(b.layer))
    for t in direct.tensors:
        a, b = ours.tensor(t.name), theirs.tensor(t.name)
        if t.name.endswith("A_log"):
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)
        else:
            assert a.dtype == b.dtype and torch.equal(a, b), t.name


def test_jambas_default_schedule_from_a_gguf(tmp_path: Path) -> None:
    """JambaConfig's own schedule (attention every 8th layer from 4, the MoE every 2nd from 1) over 6
    layers: one attention layer, which the file gives back as another period laying out the same
    layers; the model is the same."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = json.loads((save_checkpoint("jamba", tmp_path / "tiny") / "config.json").read_text())
    for key in ("attn_layer_period", "attn_layer_offset", "expert_layer_period", "expert_layer_offset"):
        config.pop(key)
    torch.manual_seed(5)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**{**config, "num_hidden_layers": 6}))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if any(part in name for part in ("layernorm.", "mamba.D", "conv1d.bias", "dt_proj.bias")):
                p.normal_(0.0 if name.endswith(".bias") else 1.0, 0.2)
    model.save_pretrained(tmp_path / "hf")
    index = convert_gguf(export_jamba_gguf(tmp_path / "hf", tmp_path / "model.gguf"), tmp_path / "ftw")
    saved = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config_differences(index.source_config, saved) == {"attn_layer_period": (5, 8)}
    assert layer_kinds(index.source_config) == layer_kinds(saved) == ["mamba"] * 4 + ["attention", "mamba"]
    assert index.config["moe_layers"] == [1, 3, 5]
    ours = convert_and_load(tmp_path / "model.gguf", tmp_path / "store")
    assert_parity(ours, hf_model(tmp_path / "hf"), PROMPT, 8)


def test_attention_layers_no_period_lays_out_are_refused(tmp_path: Path) -> None:
    src = save_checkpoint("jamba", tmp_path / "hf")
    gguf_path = export_jamba_gguf(src, tmp_path / "model.gguf", kv_heads=[0, 2, 2, 0, 2])
    with pytest.raises(UnsupportedArchitectureError, match=r"attention on layers \[1, 2, 4\]"):
        convert_gguf(gguf_path, tmp_path / "ftw")


@pytest.mark.parametrize(("layers_on", "num_layers", "expected"), [
    ([1, 4], 5, (3, 1)),  # the tiny checkpoint's
    ([4, 12, 20, 28], 32, (8, 4)),  # Jamba-v0.1's attention
    ([4], 6, (5, 4)),  # one layer: a period that reaches no other
    ([0], 1, (1, 0)),
    ([], 4, (5, 4)),  # none: an offset past the last layer
    ([2, 3], 5, None),  # the period (1) not above the offset
    ([1, 3, 4], 5, None),  # not evenly spaced
])
def test_period_and_offset(layers_on: list[int], num_layers: int, expected: tuple[int, int] | None) -> None:
    assert _period_and_offset(layers_on, num_layers) == expected
    if expected is not None:
        period, offset = expected
        assert [i for i in range(num_layers) if i % period == offset] == layers_on
