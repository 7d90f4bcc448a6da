"""Gemma 4's MoE text model (gemma4) as a GGUF file, written the way llama.cpp's converter writes it
(conversion/gemma.py, Gemma4Model over Gemma3Model, at llama.cpp 0c1e570), pulled through ft and run
against transformers.

`export_gemma4_gguf` follows that converter on the tiny gemma4 checkpoint the parity test builds (a
Gemma4ForConditionalGeneration): the text config laid over the top level, the base keys, Gemma3Model's
(context length, rms eps, rope.freq_base the full layers' base, final_logit_softcapping,
attention.sliding_window) and Gemma4Model's (shared_kv_layers 0, embedding_length_per_layer_input 0,
sliding_window_pattern one bool a layer, key/value_length the full head and _swa the sliding one,
expert_feed_forward_length, head_count_kv one a layer, rope.dimension_count the whole full head and
_swa the sliding head's rotated part), rope.freq_base_swa (the base's); the proportional RoPE as the
rope_freqs tensor (1 on the turning pairs, 1e30 on the rest); the vision tower left out,
`model.language_model.` read as `model.`, norms unshifted (Gemma 4's RMSNorm multiplies by w), the
embedding cut to the tokenizer's count (Gemma3Model; the whole of it here, as in the release),
router.scale as ffn_gate_inp.scale and per_expert_scale as ffn_down_exps.scale (not folded into the
weights), layer_scalar as layer_output_scale, the fused experts kept fused. The vocabulary is
Gemma4Model.set_vocab's from a Gemma-style tokenizer.json (SentencePiece-like BPE, byte fallback,
special tokens at the release's ids: pad 0, eos 1, bos 2, unk 3), read by gguf-py's own LlamaHfVocab
and SpecialVocab as the converter does: tokenizer model "gemma4", the chat-channel tokens
USER_DEFINED, scores -1000, merges, add_bos true, add_space_prefix false.
"""

from __future__ import annotations

import json
import re
from itertools import pairwise
from pathlib import Path

import gguf
import pytest
import torch
from gguf.constants import MODEL_ARCH

from ftw import convert_checkpoint
from ftw.errors import SourceError, UnsupportedArchitectureError
from ftw.gguf_convert import convert_gguf
from ftw.gguf_file import GGUFModel
from ftw.gguf_source import architecture_for
from tests.checkpoints import load_all, save_checkpoint
from tests.gguf_export import add_arch_keys, config_differences
from tests.parity import assert_parity, convert_and_load
from tests.test_ftw_convert import assert_round_trip
from tests.test_ftw_gguf_hf import _gguf_name, write_gguf
from tests.test_parity import PROMPT, STEPS, hf_model

pytest.importorskip("transformers")

SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "<|turn>", "<turn|>"]
VISIBLE = ["<|channel>", "<channel|>", "<|tool_call>", "<tool_call|>"]  # Gemma4Model makes them USER_DEFINED
NEWLINES = ["\n", "\n\n", "\n\n\n"]
BYTES = [f"<0x{b:02X}>" for b in (0x0A, 0xC3, 0xA9, 0xE2, 0x82, 0xAC)]  # enough for "é" and "€" to fall back


def write_gemma_tokenizer(out: Path, size: int) -> None:
    """A Gemma-style tokenizer.json of exactly `size` tokens (as the release's has the embedding's
    count): special tokens first, byte tokens, newline runs, then BPE pieces trained on the tiny corpus
    (the last merges dropped to fit); normalizer " " -> "▁", no pre-tokenizer, byte fallback."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    from ftpull.tiny import _load_corpus

    bpe = Tokenizer(models.BPE(byte_fallback=True, unk_token="<unk>"))
    bpe.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="never", split=True)
    corpus = " ".join(_load_corpus().split())  # (no newline inside a piece: llama.cpp splits lines apart)
    trainer = trainers.BpeTrainer(vocab_size=size, show_progress=False, limit_alphabet=60)
    bpe.train_from_iterator([corpus], trainer=trainer)
    trained = json.loads(bpe.to_str())["model"]
    fixed = SPECIALS + VISIBLE + BYTES + NEWLINES
    pieces = [t for t in sorted(trained["vocab"], key=trained["vocab"].get) if t not in fixed]
    merges = [m if isinstance(m, list) else m.split(" ") for m in trained["merges"]]
    while len(fixed) + len(pieces) > size:  # drop the last merge and its piece
        dropped = "".join(merges.pop())
        pieces.remove(dropped)
    merges = [["\n", "\n"]] + merges
    vocab = {t: i for i, t in enumerate(fixed + pieces)}
    assert len(vocab) == size and all(a in vocab and b in vocab for a, b in merges[1:])
    doc = {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [{"id": vocab[t], "content": t, "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": False, "special": True} for t in SPECIALS + VISIBLE],
        "normalizer": {"type": "Replace", "pattern": {"String": " "}, "content": "▁"},
        "pre_tokenizer": None,
        "post_processor": {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<bos>", "type_id": 0}},
                                                                   {"Sequence": {"id": "A", "type_id": 0}}],
                           "pair": [{"SpecialToken": {"id": "<bos>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                                    {"Sequence": {"id": "B", "type_id": 1}}],
                           "special_tokens": {"<bos>": {"id": "<bos>", "ids": [2], "tokens": ["<bos>"]}}},
        "decoder": {"type": "Sequence", "decoders": [{"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
                                                     {"type": "ByteFallback"}, {"type": "Fuse"}]},
        "model": {"type": "BPE", "dropout": None, "unk_token": "<unk>", "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": True, "byte_fallback": True, "ignore_merges": False,
                  "vocab": vocab, "merges": merges},
    }
    (out / "tokenizer.json").write_text(json.dumps(doc))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "add_bos_token": True, "add_eos_token": False,
        "bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>", "unk_token": "<unk>",
        "mask_token": "<mask>", "extra_special_tokens": ["<|turn>", "<turn|>", *VISIBLE]}))


def _add_vocab(w: gguf.GGUFWriter, src: Path) -> int:
    """Gemma4Model.set_vocab; returns the vocabulary's size."""
    vocab = gguf.LlamaHfVocab(src)
    tokens, scores, types = [], [], []
    for text, score, kind in vocab.all_tokens():
        tokens.append(text)
        scores.append(score)
        types.append(gguf.TokenType.USER_DEFINED if text.decode() in VISIBLE else kind)
    w.add_tokenizer_model("gemma4")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    gguf.SpecialVocab(src, load_merges=True).add_to_gguf(w)
    w.add_add_space_prefix(False)
    w.add_add_bos_token(True)
    return len(tokens)


def export_gemma4_gguf(src: Path, out: Path, *, keys: dict | None = None, rope_freqs: list[float] | None = None,
                       drop: tuple[str, ...] = ()) -> Path:
    """The file Gemma4Model writes from `src` (which needs the tokenizer files); `keys` overrides metadata
    (gemma4.<key>: value), `rope_freqs` the factors, `drop` leaves out tensors by GGUF name."""
    top = json.loads((src / "config.json").read_text())
    c = {**top, **top["text_config"]}  # (TextModel.__init__)
    layers, rope = c["num_hidden_layers"], c["rope_parameters"]
    sliding = [t == "sliding_attention" for t in c["layer_types"]]
    # (global_head_dim and num_global_key_value_heads, else per_layer_config's first full layer, as transformers
    # 5.25 saves the sizes)
    first_full = (c.get("per_layer_config") or {}).get(str(sliding.index(False)), {})
    full_dim = c.get("global_head_dim") or first_full["head_dim"]
    full_kv = c.get("num_global_key_value_heads") or first_full["num_key_value_heads"]
    values = {
        "block_count": layers, "context_length": c["max_position_embeddings"], "embedding_length": c["hidden_size"],
        "feed_forward_length": c["intermediate_size"], "attention.head_count": c["num_attention_heads"],
        "attention.head_count_kv": [c["num_key_value_heads"] if s else full_kv for s in sliding],
        "rope.freq_base": rope["full_attention"]["rope_theta"], "rope.freq_base_swa": rope["sliding_attention"]["rope_theta"],
        "attention.layer_norm_rms_epsilon": c["rms_norm_eps"], "expert_count": c["num_experts"],
        "expert_used_count": c["num_experts_per_tok"], "attention.key_length": full_dim,
        "attention.value_length": full_dim, "attention.key_length_swa": c["head_dim"],
        "attention.value_length_swa": c["head_dim"], "final_logit_softcapping": c["final_logit_softcapping"],
        "attention.sliding_window": c["sliding_window"], "attention.shared_kv_layers": c["num_kv_shared_layers"],
        "embedding_length_per_layer_input": c["hidden_size_per_layer_input"],
        "attention.sliding_window_pattern": sliding, "expert_feed_forward_length": c["moe_intermediate_size"],
        "rope.dimension_count": full_dim, "rope.dimension_count_swa": c["head_dim"],
        **(keys or {}),
    }
    w = gguf.GGUFWriter(out, "gemma4")
    add_arch_keys(w, "gemma4", values)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    real_vocab = _add_vocab(w, src)
    if rope_freqs is None:  # (generate_extra_tensors)
        turning = int(full_dim * rope["full_attention"]["partial_rotary_factor"] / 2)
        rope_freqs = [1.0] * turning + [1e30] * (full_dim // 2 - turning)
    if "rope_freqs.weight" not in drop:
        w.add_tensor("rope_freqs.weight", torch.tensor(rope_freqs, dtype=torch.float32).numpy())
    maps = [gguf.get_tensor_name_map(MODEL_ARCH.GEMMA4, layers)]
    for name, t in load_all(src).items():
        if not name.startswith("model.language_model."):
            continue  # (the vision tower and its embedder: the mmproj file's)
        name, t = name.replace("model.language_model.", "model."), t.float()
        if name.endswith("embed_tokens.weight"):
            t = t[:real_vocab]  # (Gemma3Model.modify_tensors)
        if name.endswith("router.scale"):
            gguf_name = name.split(".")[2].join(("blk.", ".ffn_gate_inp.scale"))
        elif name.endswith("router.per_expert_scale"):
            gguf_name = name.split(".")[2].join(("blk.", ".ffn_down_exps.scale"))
        else:
            if name.endswith(("layer_scalar", "experts.gate_up_proj", "experts.down_proj")):
                name += ".weight"  # (Gemma4Model.filter_tensors)
            gguf_name = _gguf_name(maps, name)
        if gguf_name not in drop:
            w.add_tensor(gguf_name, t.contiguous().numpy())
    return write_gguf(w, out)


def gemma4_source(tmp_path: Path, seed: int = 1) -> Path:
    src = save_checkpoint("gemma4_text", tmp_path / "hf", seed=seed)
    write_gemma_tokenizer(src, json.loads((src / "config.json").read_text())["text_config"]["vocab_size"])
    return src


def test_gemma4_gguf_generates_what_transformers_does(tmp_path: Path) -> None:
    src = gemma4_source(tmp_path)
    ours = convert_and_load(export_gemma4_gguf(src, tmp_path / "model.gguf"), tmp_path / "store")
    assert ours.config.get("attention_k_eq_v") is True
    assert_parity(ours, hf_model(src), PROMPT, STEPS)


def test_gemma4_gguf_config_and_tensors_are_the_checkpoints(tmp_path: Path) -> None:
    """The FTW config is the HF checkpoint's but for the model type (the text model the file holds, where
    the checkpoint's is its gemma4 wrapper); the source config is its text config but per_layer_config
    (transformers' derived save: the file gives the released keys) and the sliding layers' partial factor;
    every text tensor comes back under its HF name, bit for bit."""
    src = gemma4_source(tmp_path)
    direct = convert_checkpoint(src, tmp_path / "ftw-hf")
    index = convert_gguf(export_gemma4_gguf(src, tmp_path / "model.gguf"), tmp_path / "ftw")
    assert config_differences(index.config, direct.config) == {"model_type": ("gemma4_text", "gemma4")}
    assert index.config.keys() == direct.config.keys()
    text = json.loads((src / "config.json").read_text())["text_config"]
    assert config_differences(index.source_config, text) == {}
    assert set(text) - set(index.source_config) <= {"per_layer_config", "attention_dropout", "initializer_range",
                                                    "use_cache", "vocab_size_per_layer_input", "dtype"}
    assert {t.name for t in index.tensors} == {t.name for t in direct.tensors}
    assert_round_trip(src, tmp_path / "ftw")  # every text tensor back under its HF name, bit for bit


def _llama_cpp_gemma4(text: str, tokens: list[str], types: list[int], merges: list[str]) -> list[int]:
    """llama.cpp's tokenizer for a "gemma4" vocabulary (llm_tokenizer_bpe_session with the GEMMA4
    pre-tokenizer), in plain Python: special tokens cut out first, BOS added, spaces as "▁", the text
    split into lines and runs of newlines, a run of newlines that is a token taken whole, else
    the lowest-ranked merge first over UTF-8 characters, unknown symbols as their <0xXX> bytes."""
    ids = {t: i for i, t in enumerate(tokens)}
    ranks = {(m[: m.index(" ", 1)], m[m.index(" ", 1) + 1 :]): r for r, m in enumerate(merges)}
    fragments: list[str | int] = [text]
    for special in sorted((t for t, k in zip(tokens, types, strict=True) if k in (2, 3, 4)), key=len, reverse=True):
        cut: list[str | int] = []
        for fragment in fragments:
            if isinstance(fragment, int):
                cut.append(fragment)
                continue
            for n, part in enumerate(fragment.split(special)):
                cut += ([ids[special]] if n else []) + ([part] if part else [])
        fragments = cut
    out = [ids["<bos>"]]
    for fragment in fragments:
        if isinstance(fragment, int):
            out.append(fragment)
            continue
        for word in re.findall(r"[^\n]+|\n+", fragment.replace(" ", "▁")):
            if word.strip("\n") == "" and word in ids:
                out.append(ids[word])
                continue
            symbols = list(word)
            while True:
                pairs = [(ranks[(a, b)], j) for j, (a, b) in enumerate(pairwise(symbols)) if (a, b) in ranks]
                if not pairs:
                    break
                _, j = min(pairs)
                symbols[j : j + 2] = [symbols[j] + symbols[j + 1]]
            for s in symbols:
                out += [ids[s]] if s in ids else [ids[f"<0x{b:02X}>"] for b in s.encode() if f"<0x{b:02X}>" in ids]
    return out


def test_gemma4_gguf_tokenizer_is_llama_cpps(tmp_path: Path) -> None:
    """The tokenizer ft rebuilds from the file tokenizes as llama.cpp does (and as the checkpoint's own
    tokenizer.json, but for BOS, which llama.cpp always adds): spaces, lines, runs of newlines taken
    whole where the vocabulary has them, byte fallback, special and chat-channel tokens; it decodes back.
    (A run longer than the vocabulary's longest is cut at that token, where llama.cpp merges it: not tested.)"""
    from tokenizers import Tokenizer

    src = gemma4_source(tmp_path)
    index = convert_gguf(export_gemma4_gguf(src, tmp_path / "model.gguf"), tmp_path / "ftw")
    del index
    ours = Tokenizer.from_file(str(tmp_path / "ftw" / "tokenizer.json"))
    theirs = Tokenizer.from_file(str(src / "tokenizer.json"))
    meta = GGUFModel(tmp_path / "model.gguf").metadata
    tokens, types, merges = meta["tokenizer.ggml.tokens"], meta["tokenizer.ggml.token_type"], meta["tokenizer.ggml.merges"]
    config = json.loads((tmp_path / "ftw" / "tokenizer_config.json").read_text())
    assert (config["bos_token"], config["eos_token"], config["pad_token"], config["add_bos_token"]) == (
        "<bos>", "<eos>", "<pad>", True)
    # (every character in the vocabulary or its bytes: llama.cpp drops one that is neither, transformers says <unk>)
    for text in ("the brown fox", " the  lazy dog.\n\nthen runs;\n\n\n a model", "café costs 5€",
                 "<|turn>user\nanswers<turn|>\n<|channel>thought<channel|>the reference", "\n", "x\n\n\ny"):
        expected = _llama_cpp_gemma4(text, tokens, types, merges)
        assert ours.encode(text).ids == expected, text
        if "\n\n\n" not in text:  # (the checkpoint's BPE merges runs of newlines; llama.cpp takes them whole)
            assert theirs.encode(text).ids == expected, text
        assert ours.decode(expected, skip_special_tokens=False).endswith(text.replace("<bos>", ""))


def test_gemma4_gguf_refuses_what_llama_cpp_or_ft_runs_otherwise(tmp_path: Path) -> None:
    src = gemma4_source(tmp_path)
    cases = [
        (dict(keys={"attention.sliding_window_pattern": [True, False, True, True]}), UnsupportedArchitectureError,
         "last layer is sliding"),
        (dict(keys={"embedding_length_per_layer_input": 8}), UnsupportedArchitectureError, "per-layer embeddings"),
        (dict(keys={"attention.shared_kv_layers": 2}), UnsupportedArchitectureError, "sharing another's KV"),
        (dict(keys={"rope.dimension_count_swa": 8}), UnsupportedArchitectureError, "sliding layers' 16"),
        (dict(rope_freqs=[1.0, 2.0] + [1e30] * 14), UnsupportedArchitectureError, "proportional pattern"),
        (dict(drop=("rope_freqs.weight",)), SourceError, "without rope_freqs"),
        (dict(drop=("blk.0.attn_v.weight",)), UnsupportedArchitectureError, "sliding layer without attn_v"),
        (dict(drop=tuple(f"blk.{i}.{n}" for i in range(4) for n in ("ffn_gate_inp.weight", "ffn_gate_inp.scale",
                                                                      "ffn_down_exps.scale", "ffn_gate_up_exps.weight",
                                                                      "ffn_down_exps.weight", "pre_ffw_norm_2.weight",
                                                                      "post_ffw_norm_1.weight", "post_ffw_norm_2.weight"))),
         UnsupportedArchitectureError, "dense Gemma 4"),
    ]
    for i, (kwargs, error, message) in enumerate(cases):
        with pytest.raises(error, match=message):
            convert_gguf(export_gemma4_gguf(src, tmp_path / f"{i}.gguf", **kwargs), tmp_path / f"ftw{i}")


def test_gemma4_gguf_reads_the_proportional_fraction_and_the_softcap(tmp_path: Path) -> None:
    """rope_freqs with half the pairs turning gives partial_rotary_factor 0.5; a file without
    final_logit_softcapping caps nothing (llama.cpp's), not Gemma4TextConfig's 30."""
    src = gemma4_source(tmp_path)
    model = GGUFModel(export_gemma4_gguf(src, tmp_path / "half.gguf", rope_freqs=[1.0] * 8 + [1e30] * 8,
                                         keys={"final_logit_softcapping": None}))
    config = architecture_for(model).hf_config(model)
    assert config["rope_parameters"]["full_attention"]["partial_rotary_factor"] == 0.5
    assert config["final_logit_softcapping"] is None and config["attention_k_eq_v"] is True
