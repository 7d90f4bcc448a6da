"""MiniMax-Text-01 (minimax) as a GGUF file (`minimax-01`), written the way llama.cpp's converter writes it
(conversion/minimax.py, MiniMaxText01Model over TextModel, at llama.cpp 0c1e570), pulled through ft and run
against transformers.

`export_minimax01_gguf` follows that converter: the base keys (feed_forward_length from intermediate_size,
key_length from head_dim, expert_count from num_local_experts), tokenizer.ggml.suppress_tokens (the ids past
the tokenizer's whose embedding rows are all zero), residual_scale and rope.dimension_count; the experts
stacked, nothing permuted. The converter reads the release's own config names, which a transformers-saved
config spells otherwise, so the exporter maps them: layernorm_{full_attention,linear_attention,mlp}_alpha
and _beta are transformers' *_alpha_factor and *_beta_factor (the converter asserts the alphas equal, writes
one as residual_scale, and the betas all 1: so are the checkpoints here), rotary_dim is what transformers'
MiniMax rotates, the whole head. No layer kinds are written: minimax-01.cpp's loader makes every eighth layer
full ((i + 1) % 8 == 0, full_attention_interval's default), so the checkpoints here have 8 layers, seven of
lightning attention and a last full one. transformers saves its lightning layers' decay buffers, which the
release does not ship and the converter has no name for: they are left out of the checkpoints here.
gguf 0.19 has no minimax-01 architecture: its llama table gives the names it shares with Mixtral, and
llama-arch.cpp's attn_qkv, attn_gate and attn_norm_2 the lightning layers' own.
"""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import pytest
import torch
from gguf.constants import MODEL_ARCH
from safetensors.torch import load_file, save_file

from ftw import convert_checkpoint
from ftw.errors import SourceError, UnsupportedArchitectureError
from ftw.gguf_convert import convert_gguf
from tests.checkpoints import FAMILY_CONFIGS, load_all, save_checkpoint
from tests.gguf_export import add_base_keys, add_padded_vocab, config_differences
from tests.parity import assert_parity, convert_and_load
from tests.test_ftw_convert import assert_round_trip
from tests.test_ftw_gguf_hf import _gguf_name, add_stacked_experts, collect_expert, write_gguf
from tests.test_parity import PROMPT, STEPS, hf_model

pytest.importorskip("transformers")

NUM_PAD = 16  # add_padded_vocab's tokens past the tokenizer's: the "added tokens" with zero embeddings here
KINDS = ["linear_attention"] * 7 + ["full_attention"]  # full_attention_interval 8
# llama-arch.cpp's names for the lightning layers' tensors (after "model.layers.N."; out_proj is attn_output)
OWN_NAMES = {"self_attn.qkv_proj.weight": "attn_qkv.weight", "self_attn.output_gate.weight": "attn_gate.weight",
             "self_attn.norm.weight": "attn_norm_2.weight", "self_attn.out_proj.weight": "attn_output.weight"}
DECAY_BUFFERS = ("slope_rate", "query_decay", "key_decay", "diagonal_decay")


def save_minimax(out: Path, monkeypatch: pytest.MonkeyPatch, **overrides) -> Path:
    """The parity test's minimax checkpoint (lightning blocks of 5 tokens, GQA, random norms) in the layout
    llama.cpp reads: 8 layers, the last full; every alpha 1.25 and every beta 1; the padding tokens' embedding
    rows zero (the release's untrained added tokens); no decay buffers; with `overrides`."""
    alphas = {f"{k}_alpha_factor": 1.25 for k in ("full_attn", "linear_attn", "mlp")}
    betas = {f"{k}_beta_factor": 1.0 for k in ("full_attn", "linear_attn", "mlp")}
    config = {**FAMILY_CONFIGS["minimax"], "num_hidden_layers": 8, "layer_types": KINDS, **alphas, **betas, **overrides}
    monkeypatch.setitem(FAMILY_CONFIGS, "minimax", config)
    save_checkpoint("minimax", out, seed=1)
    for file in out.glob("*.safetensors"):
        tensors = {n: t for n, t in load_file(file).items() if not n.endswith(DECAY_BUFFERS)}
        if "model.embed_tokens.weight" in tensors:
            tensors["model.embed_tokens.weight"][-NUM_PAD:] = 0
        save_file(tensors, file, metadata={"format": "pt"})
    return out


def export_minimax01_gguf(src: Path, out: Path, *, keys: dict | None = None, residual_scale: bool = True,
                          recurrent_layers: list[bool] | None = None) -> Path:
    """The file MiniMaxText01Model writes from `src`; `keys`, further uint32 keys (or in place of
    rope.dimension_count); without `residual_scale`, none; `recurrent_layers`, attention.recurrent_layers
    (which the converter does not write, llama.cpp's loader reads)."""
    c = json.loads((src / "config.json").read_text())
    layers = c["num_hidden_layers"]
    hparams = {f"layernorm_{name}_{part}": c[f"{short}_{part}_factor"] for name, short in
               (("full_attention", "full_attn"), ("linear_attention", "linear_attn"), ("mlp", "mlp"))
               for part in ("alpha", "beta")} | {"rotary_dim": c["head_dim"]}
    assert hparams["layernorm_full_attention_alpha"] == hparams["layernorm_linear_attention_alpha"] \
        == hparams["layernorm_mlp_alpha"]
    assert all(hparams[f"layernorm_{n}_beta"] == 1.0 for n in ("full_attention", "linear_attention", "mlp"))
    tensors = load_all(src)
    embed = tensors["model.embed_tokens.weight"]
    real = c["vocab_size"] - NUM_PAD  # (the tokenizer's vocab_size: the added tokens after it)
    suppress = (torch.nonzero(torch.all(embed[real:] == 0, dim=1)).flatten() + real).tolist()
    w = gguf.GGUFWriter(out, "minimax-01")
    add_base_keys(w, c)
    if suppress:
        w.add_array("tokenizer.ggml.suppress_tokens", suppress)
    if residual_scale:
        w.add_residual_scale(hparams["layernorm_full_attention_alpha"])
    keys = keys or {}
    if "rope.dimension_count" not in keys:
        w.add_rope_dimension_count(hparams["rotary_dim"])
    for key, value in keys.items():
        w.add_uint32(f"minimax-01.{key}", value)
    if recurrent_layers is not None:
        w.add_array("minimax-01.attention.recurrent_layers", recurrent_layers)
    add_padded_vocab(w, c["vocab_size"], "gpt-2", num_pad=NUM_PAD, bos=c.get("bos_token_id"), eos=c.get("eos_token_id"))
    maps = [gguf.get_tensor_name_map(MODEL_ARCH.LLAMA, layers)]
    experts: dict = {}
    for name, t in tensors.items():
        if ".block_sparse_moe.experts." in name:
            collect_expert(experts, name, t.float())
            continue
        parts = name.split(".")
        own = OWN_NAMES.get(".".join(parts[3:])) if name.startswith("model.layers.") else None
        w.add_tensor(f"blk.{parts[2]}.{own}" if own else _gguf_name(maps, name), t.float().contiguous().numpy())
    add_stacked_experts(w, maps, experts)
    return write_gguf(w, out)


def test_minimax01_gguf_generates_what_transformers_does(tmp_path: Path, monkeypatch) -> None:
    """The released layout: seven lightning layers and a full one, by the loader's default interval; the
    suppressed padding tokens are not suppressed (a rule of llama.cpp's sampler; transformers has none)."""
    src = save_minimax(tmp_path / "hf", monkeypatch)
    ours = convert_and_load(export_minimax01_gguf(src, tmp_path / "model.gguf"), tmp_path / "store")
    assert ours.config.get("layer_types") == KINDS
    assert_parity(ours, hf_model(src), PROMPT, STEPS)


def test_minimax01_gguf_recurrent_layers_generates_what_transformers_does(tmp_path: Path, monkeypatch) -> None:
    """Layer kinds from attention.recurrent_layers where a file has it (the loader reads it before the
    interval): transformers' default alternation, full first."""
    kinds = ["full_attention" if i % 2 == 0 else "linear_attention" for i in range(8)]
    src = save_minimax(tmp_path / "hf", monkeypatch, layer_types=kinds)
    gguf_path = export_minimax01_gguf(src, tmp_path / "model.gguf", recurrent_layers=[k != "full_attention" for k in kinds])
    ours = convert_and_load(gguf_path, tmp_path / "store")
    assert ours.config.get("layer_types") == kinds
    assert_parity(ours, hf_model(src), PROMPT, STEPS)


def test_minimax01_gguf_config_is_the_checkpoints(tmp_path: Path, monkeypatch) -> None:
    """The FTW config and tensors from the GGUF are the HF path's (the layer kinds, the alphas and betas, the
    lightning layers' own tensors and out_proj beside the full layer's o_proj), the source config the
    checkpoint's (its block_size the default: computation, which the file does not carry); every tensor back
    bit for bit."""
    src = save_minimax(tmp_path / "hf", monkeypatch, block_size=256)
    direct = convert_checkpoint(src, tmp_path / "ftw-hf")
    index = convert_gguf(export_minimax01_gguf(src, tmp_path / "model.gguf"), tmp_path / "ftw")
    assert index.family == direct.family == "minimax"
    assert index.config == direct.config
    assert config_differences(index.source_config, json.loads((src / "config.json").read_text())) == {}
    assert {t.name for t in index.tensors} == {t.name for t in direct.tensors}
    assert_round_trip(src, tmp_path / "ftw")


def test_minimax01_gguf_refusals(tmp_path: Path, monkeypatch) -> None:
    """Rotation over part of each head (llama.cpp's n_rot; transformers' MiniMax rotates the whole) refused
    by name; a file without residual_scale, which llama.cpp's loader requires, is damaged."""
    src = save_minimax(tmp_path / "hf", monkeypatch)
    with pytest.raises(UnsupportedArchitectureError, match="rotating 8 of each head's 16 channels"):
        convert_gguf(export_minimax01_gguf(src, tmp_path / "half.gguf", keys={"rope.dimension_count": 8}),
                     tmp_path / "ftw-half")
    with pytest.raises(SourceError, match="without residual_scale"):
        convert_gguf(export_minimax01_gguf(src, tmp_path / "bare.gguf", residual_scale=False), tmp_path / "ftw-bare")
