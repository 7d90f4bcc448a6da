"""Phi-3.5-MoE (phimoe) as a GGUF file, written the way llama.cpp's converter writes it
(conversion/phi.py, PhiMoeModel over Phi3MiniModel, at llama.cpp 0c1e570), pulled through ft and run
against transformers.

`export_phimoe_gguf` follows that converter: Phi3MiniModel's keys (context_length,
rope.scaling.original_context_length, feed_forward_length, the rms eps from rms_norm_eps,
rope.dimension_count, rope.freq_base, attention.sliding_window or 0), PhiMoeModel's expert counts,
LongRoPE's factors as the rope_factors_long/short tensors with rope.scaling.attn_factor (sqrt(1 +
ln(s) / ln(original)), s = context / original); the experts stacked, gguf-py's names, nothing
permuted; a SentencePiece vocabulary ("llama", pre "default") padded with [PAD<i>] tokens, the added
tokens over them, as its set_vocab writes one.

The file cannot say two things the checkpoint does: its short_mscale/long_mscale (the file has one
attn_factor, which becomes both) and router_jitter_noise (sparsemixer's eps; the release's 0.01 is
read). The parity test uses a checkpoint with those values; the config test pins what comes back.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf.constants import MODEL_ARCH
from tokenizers import Tokenizer

from ftw import convert_checkpoint
from ftw.errors import UnsupportedArchitectureError
from ftw.gguf_convert import convert_gguf
from tests.checkpoints import FAMILY_CONFIGS, load_all, save_checkpoint
from tests.gguf_export import config_differences
from tests.gguf_vocab import BYTE, CONTROL, NORMAL, UNKNOWN, UNUSED, llama_cpp_spm
from tests.parity import assert_parity, convert_and_load
from tests.test_ftw_convert import assert_round_trip
from tests.test_ftw_gguf_hf import _gguf_name, add_stacked_experts, collect_expert, write_gguf
from tests.test_parity import PROMPT, STEPS, hf_model

pytest.importorskip("transformers")

# a SentencePiece vocabulary (the tokenizer's pieces), then padding, then Phi-3.5's added tokens at the
# ids added_tokens.json gives them (CONTROL: special in tokenizer_config.json), padding after them
PIECES = [("<unk>", UNKNOWN), ("<s>", CONTROL), ("</s>", CONTROL), ("<0x0A>", BYTE), ("▁", NORMAL), ("a", NORMAL),
          ("b", NORMAL), ("c", NORMAL), ("▁a", NORMAL), ("▁b", NORMAL), ("ab", NORMAL), ("▁ab", NORMAL),
          ("abc", NORMAL), ("▁abc", NORMAL)]
ADDED = {"<|endoftext|>": 240, "<|assistant|>": 241, "<|end|>": 247, "<|user|>": 250}


def spm_vocab(vocab_size: int) -> tuple[list[str], list[int], list[float]]:
    """Phi3MiniModel.set_vocab's layout: [PAD<i>] UNUSED at -10000 first, the pieces over them (scored
    as SentencePiece scores BPE pieces), the added tokens at -1000."""
    tokens, types, scores = [f"[PAD{i}]" for i in range(vocab_size)], [UNUSED] * vocab_size, [-10000.0] * vocab_size
    for i, (piece, kind) in enumerate(PIECES):
        tokens[i], types[i], scores[i] = piece, kind, -float(i) if kind == NORMAL else 0.0
    for token, i in ADDED.items():
        tokens[i], types[i], scores[i] = token, CONTROL, -1000.0
    return tokens, types, scores


def export_phimoe_gguf(src: Path, out: Path, *, experts_used: int | None = None) -> Path:
    c = json.loads((src / "config.json").read_text())
    rope, layers = c["rope_parameters"], c["num_hidden_layers"]
    heads, hidden = c["num_attention_heads"], c["hidden_size"]
    w = gguf.GGUFWriter(out, "phimoe")
    original = rope["original_max_position_embeddings"]
    w.add_context_length(c["max_position_embeddings"])  # Phi3MiniModel.set_gguf_parameters
    w.add_rope_scaling_orig_ctx_len(original)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(c["intermediate_size"])
    w.add_block_count(layers)
    w.add_head_count(heads)
    w.add_head_count_kv(c["num_key_value_heads"])
    w.add_layer_norm_rms_eps(c["rms_norm_eps"])
    w.add_rope_dimension_count(hidden // heads)
    w.add_rope_freq_base(rope["rope_theta"])
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_sliding_window(c.get("sliding_window") or 0)
    w.add_expert_used_count(experts_used or c["num_experts_per_tok"])  # PhiMoeModel's
    w.add_expert_count(c["num_local_experts"])
    tokens, types, scores = spm_vocab(c["vocab_size"])
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(c["bos_token_id"])
    w.add_eos_token_id(c["eos_token_id"])
    w.add_unk_token_id(0)
    w.add_chat_template("{{ messages[0]['content'] }}")
    scale = c["max_position_embeddings"] / original  # generate_extra_tensors (longrope)
    w.add_rope_scaling_attn_factors(math.sqrt(1 + math.log(scale) / math.log(original)) if scale > 1.0 else 1.0)
    maps = [gguf.get_tensor_name_map(MODEL_ARCH.PHIMOE, layers)]
    w.add_tensor("rope_factors_long.weight", np.asarray(rope["long_factor"], dtype=np.float32))
    w.add_tensor("rope_factors_short.weight", np.asarray(rope["short_factor"], dtype=np.float32))
    experts: dict = {}
    for name, t in load_all(src).items():
        if ".experts." in name:
            collect_expert(experts, name, t.float())
        else:
            w.add_tensor(_gguf_name(maps, name), t.float().contiguous().numpy())
    add_stacked_experts(w, maps, experts)
    return write_gguf(w, out)


def attn_factor(c: dict) -> float:
    original = c["rope_parameters"]["original_max_position_embeddings"]
    return math.sqrt(1 + math.log(c["max_position_embeddings"] / original) / math.log(original))


def test_phimoe_gguf_generates_what_transformers_does(tmp_path: Path, monkeypatch) -> None:
    """With what the file can say (one mscale, the release's sparsemixer eps), the GGUF runs as
    transformers' PhiMoE runs the checkpoint: LayerNorms, sparsemixer top-2, LongRoPE's short factors."""
    c = FAMILY_CONFIGS["phimoe"]
    mscale = attn_factor(c)
    monkeypatch.setitem(FAMILY_CONFIGS, "phimoe", {**c, "router_jitter_noise": 0.01, "rope_parameters": {
        **c["rope_parameters"], "short_mscale": mscale, "long_mscale": mscale}})
    src = save_checkpoint("phimoe", tmp_path / "hf", seed=1)
    ours = convert_and_load(export_phimoe_gguf(src, tmp_path / "model.gguf"), tmp_path / "store")
    assert ours.config.get("router_jitter_noise") == 0.01
    assert_parity(ours, hf_model(src), PROMPT, STEPS)


def test_phimoe_gguf_config_tensors_and_vocabulary(tmp_path: Path) -> None:
    """The FTW config and every tensor are the checkpoint's, bit for bit; the source config differs only
    where the file cannot say the checkpoint's value (both mscales are the file's attn_factor, the
    sparsemixer eps the release's) and in the class name; the SentencePiece vocabulary tokenizes as
    llama.cpp does; a file routing to other than two experts is refused."""
    src = save_checkpoint("phimoe", tmp_path / "hf")
    hf_config = json.loads((src / "config.json").read_text())
    direct = convert_checkpoint(src, tmp_path / "ftw-hf")
    index = convert_gguf(export_phimoe_gguf(src, tmp_path / "model.gguf"), tmp_path / "ftw")
    assert index.config == direct.config
    mscale = float(str(np.float32(attn_factor(hf_config))))  # (stored float32, read as its shortest decimal)
    rope = {**hf_config["rope_parameters"], "short_mscale": mscale, "long_mscale": mscale}
    assert config_differences(index.source_config, hf_config) == {
        "architectures": (["PhiMoEForCausalLM"], ["PhimoeForCausalLM"]),
        "router_jitter_noise": (0.01, hf_config["router_jitter_noise"]),
        "rope_parameters": (rope, hf_config["rope_parameters"])}
    assert {t.name for t in index.tensors} == {t.name for t in direct.tensors}
    assert_round_trip(src, tmp_path / "ftw")
    tokens, types, scores = spm_vocab(hf_config["vocab_size"])
    ours = Tokenizer.from_file(str(tmp_path / "ftw" / "tokenizer.json"))
    for text in ("ab abc", "abc\nab", "a<|user|>b c<|end|>", " ab  c"):
        assert ours.encode(text, add_special_tokens=False).ids == llama_cpp_spm(text, tokens, types, scores), text
    with pytest.raises(UnsupportedArchitectureError, match="sparsemixer"):
        convert_gguf(export_phimoe_gguf(src, tmp_path / "top1.gguf", experts_used=1), tmp_path / "ftw-top1")
