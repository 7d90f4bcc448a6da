"""Tiny GGUF tokenizer vocabularies in the layouts real files have, and a plain-Python twin of
llama.cpp's SentencePiece tokenizer, for tests/test_ftw_gguf_tokenizer.py."""

from __future__ import annotations

import json
from itertools import pairwise
from pathlib import Path

import gguf
import numpy as np
from tokenizers import Tokenizer, models, pre_tokenizers, trainers

# gguf-py TokenType
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6


def write_tokenizer_gguf(path: Path, tokens: list[str], types: list[int], *, model: str = "gpt2",
                         pre: str | None = None, merges: list[str] | None = None, scores: list[float] | None = None,
                         ids: dict[str, int] | None = None, flags: dict[str, bool] | None = None,
                         template: str | None = None) -> Path:
    """A GGUF holding only a tokenizer (and one tensor, as every GGUF has)."""
    w = gguf.GGUFWriter(path, "qwen3moe")
    w.add_tokenizer_model(model)
    if pre:
        w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    if merges is not None:
        w.add_token_merges(merges)
    if scores is not None:
        w.add_token_scores(scores)
    for key, value in (ids or {}).items():
        w.add_uint32(f"tokenizer.ggml.{key}", value)
    for key, flag in (flags or {}).items():
        w.add_bool(f"tokenizer.ggml.{key}", flag)
    if template:
        w.add_chat_template(template)
    w.add_tensor("token_embd.weight", np.zeros((4, 4), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def export_byte_level(original: Tokenizer, vocab_size: int) -> tuple[list[str], list[int], list[str]]:
    """`original`'s vocabulary as llama.cpp's get_vocab_base writes it: by id, `[PAD{i}]` (UNUSED)
    for the ids past the tokenizer up to `vocab_size`, added tokens CONTROL if special, else
    USER_DEFINED, and the merges as 'left right' strings."""
    added = original.get_added_tokens_decoder()
    by_id = {i: t for t, i in original.get_vocab(with_added_tokens=True).items()}
    tokens = [by_id.get(i, f"[PAD{i}]") for i in range(vocab_size)]
    types = [UNUSED if i not in by_id else (CONTROL if added[i].special else USER_DEFINED) if i in added else NORMAL
             for i in range(vocab_size)]
    merges = [" ".join(pair) for pair in json.loads(original.to_str())["model"]["merges"]]
    return tokens, types, merges


def spm_trained() -> Tokenizer:
    """A SentencePiece-style BPE ("▁" words, byte fallback) trained on the tiny corpus, its alphabet
    cut to the 90 commonest characters."""
    from ftpull.tiny import _load_corpus

    bpe = Tokenizer(models.BPE(byte_fallback=True, unk_token="<unk>"))
    bpe.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always", split=True)
    trainer = trainers.BpeTrainer(vocab_size=700, min_frequency=2, show_progress=False, limit_alphabet=90)
    bpe.train_from_iterator([_load_corpus()], trainer=trainer)
    return bpe


def mixtral_layout() -> tuple[list[str], list[int], list[float]]:
    """A SentencePiece BPE vocabulary in Mixtral's layout, trained on the tiny corpus: `<unk>`,
    `<s>`, `</s>`, the 256 byte tokens, the merged pieces best first (score -rank, as SentencePiece
    scores BPE pieces), whitespace runs as Llama's vocabulary has them, then single characters
    scored below every merge. Rare characters (CJK, emoji) are left out, so they fall back to bytes."""
    model = json.loads(spm_trained().to_str())["model"]
    merged = ["▁▁", "▁▁▁▁"] + ["".join(pair) for pair in model["merges"]]
    chars = sorted((t for t in model["vocab"] if len(t) == 1), key=model["vocab"].get)
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + merged + chars
    types = [UNKNOWN, CONTROL, CONTROL] + [BYTE] * 256 + [NORMAL] * (len(merged) + len(chars))
    scores = [0.0] * 259 + [-float(i) for i in range(len(merged) + len(chars))]
    return tokens, types, scores


def llama_cpp_spm(text: str, tokens: list[str], types: list[int], scores: list[float],
                  add_space_prefix: bool = True) -> list[int]:
    """llama.cpp's SPM tokenizer (llama_vocab::impl::tokenize, llm_tokenizer_spm_session), in plain Python."""
    ids = {t: i for i, t in enumerate(tokens)}
    fragments: list[str | int] = [text]
    # control, unknown and user-defined tokens are cut out of the text first, longest first
    matched = [t for t, kind in zip(tokens, types, strict=True) if kind in (UNKNOWN, CONTROL, USER_DEFINED)]
    for special in sorted(matched, key=len, reverse=True):
        cut: list[str | int] = []
        for fragment in fragments:
            if isinstance(fragment, int):
                cut.append(fragment)
                continue
            for n, part in enumerate(fragment.split(special)):
                cut += ([ids[special]] if n else []) + ([part] if part else [])
        fragments = cut
    out: list[int] = []
    prev_special = True
    for fragment in fragments:
        if isinstance(fragment, int):
            out.append(fragment)
            prev_special = True
            continue
        symbols = list(((" " if add_space_prefix and prev_special else "") + fragment).replace(" ", "▁"))
        while True:  # merge the best-scoring adjacent pair, the leftmost of equal ones
            pairs = [(scores[ids[a + b]], -j) for j, (a, b) in enumerate(pairwise(symbols)) if a + b in ids]
            if not pairs:
                break
            j = -max(pairs)[1]
            symbols[j : j + 2] = [symbols[j] + symbols[j + 1]]
        for symbol in symbols:
            out += [ids[symbol]] if symbol in ids else [ids[f"<0x{b:02X}>"] for b in symbol.encode()]
        prev_special = False
    return out
