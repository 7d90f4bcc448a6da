"""The tokenizer a GGUF file embeds, rebuilt as Hugging Face `tokenizer.json` + `tokenizer_config.json`.

GGUF keeps the vocabulary (`tokenizer.ggml.tokens`, `.merges`, `.token_type`, special ids) but not
the pre-tokenizer: `tokenizer.ggml.pre` only names it, and llama.cpp's llama-vocab.cpp maps the
name to regexes. PRE_TOKENIZERS maps the names we know to the pipeline of the model's original
tokenizer.json. Byte-level BPE (`tokenizer.ggml.model` "gpt2") only for now; SentencePiece
("llama") vocabularies are refused. A file that embeds its tokenizer.json verbatim
(`tokenizer.huggingface.json`) is taken as is.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .errors import SourceError

# gguf-py TokenType
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

_QWEN2_SPLIT = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
_LLAMA3_SPLIT = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
_DEEPSEEK_V3_SPLITS = (
    r"\p{N}{1,3}",
    "[一-龥\u3040-ゟ゠-ヿ]+",
    r"""[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""",
)


@dataclass(frozen=True)
class PreTokenizer:
    splits: tuple[str, ...]  # regexes applied in turn, matches isolated; () = GPT-2's built-in regex
    normalizer: str | None = None  # e.g. "NFC"


PRE_TOKENIZERS: dict[str, PreTokenizer] = {
    "qwen2": PreTokenizer((_QWEN2_SPLIT,), "NFC"),  # Qwen2, Qwen2.5, Qwen3 (their tokenizer.json normalizes NFC)
    "llama-bpe": PreTokenizer((_LLAMA3_SPLIT,)),  # Llama 3
    "deepseek-v3": PreTokenizer(_DEEPSEEK_V3_SPLITS),  # DeepSeek-V3 / R1
    "gpt-2": PreTokenizer(()),  # GPT-2's ByteLevel regex
}
HF_JSON_KEY = "tokenizer.huggingface.json"


def _metadata(reader: Any) -> Mapping[str, Any]:
    return reader.metadata if hasattr(reader, "metadata") else reader


class _Vocab:
    """The validated `tokenizer.ggml.*` arrays."""

    def __init__(self, meta: Mapping[str, Any]) -> None:
        model = meta.get("tokenizer.ggml.model")
        if model != "gpt2":
            raise SourceError(
                f"GGUF tokenizer model {model!r} is not supported yet: ft rebuilds byte-level BPE ('gpt2') tokenizers "
                "only; use the model's Hugging Face tokenizer instead"
            )
        self.tokens = meta.get("tokenizer.ggml.tokens")
        if not isinstance(self.tokens, list) or not self.tokens or not all(isinstance(t, str) for t in self.tokens):
            raise SourceError("GGUF tokenizer.ggml.tokens is missing or not a list of strings")
        self.types = meta.get("tokenizer.ggml.token_type") or [NORMAL] * len(self.tokens)
        if not isinstance(self.types, list) or len(self.types) != len(self.tokens) \
                or not all(isinstance(t, int) for t in self.types):
            raise SourceError("GGUF tokenizer.ggml.token_type does not match tokenizer.ggml.tokens")
        merges = meta.get("tokenizer.ggml.merges") or []
        if not isinstance(merges, list) or not all(isinstance(m, str) and m.find(" ", 1) > 0 for m in merges):
            raise SourceError("GGUF tokenizer.ggml.merges is not a list of 'left right' strings")
        # llama.cpp splits at the first space after the first character (a token may be one space)
        self.merges = [[m[: m.index(" ", 1)], m[m.index(" ", 1) + 1 :]] for m in merges]
        self.meta = meta

    def token_id(self, key: str) -> int | None:
        value = self.meta.get(f"tokenizer.ggml.{key}")
        if value is None:
            return None
        if not isinstance(value, int) or not 0 <= value < len(self.tokens):
            raise SourceError(f"GGUF tokenizer.ggml.{key} = {value!r} is not a token id")
        return value

    def token(self, key: str) -> str | None:
        i = self.token_id(key)
        return None if i is None else self.tokens[i]

    def added(self) -> list[dict[str, Any]]:
        return [
            {"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False,
             "special": kind == CONTROL}
            for i, (t, kind) in enumerate(zip(self.tokens, self.types, strict=True))
            if kind in (CONTROL, USER_DEFINED)
        ]


def _byte_level(use_regex: bool) -> dict[str, Any]:
    return {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": use_regex}


def _post_processor(vocab: _Vocab) -> dict[str, Any]:
    """BOS/EOS added as `tokenizer.ggml.add_bos_token`/`add_eos_token` say, else plain byte-level."""
    specials = []
    if vocab.meta.get("tokenizer.ggml.add_bos_token") and (bos := vocab.token_id("bos_token_id")) is not None:
        specials.append(("bos", bos))
    if vocab.meta.get("tokenizer.ggml.add_eos_token") and (eos := vocab.token_id("eos_token_id")) is not None:
        specials.append(("eos", eos))
    if not specials:
        return _byte_level(False)

    def template(seq: str, type_id: int) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = [{"SpecialToken": {"id": vocab.tokens[i], "type_id": type_id}} for k, i in specials if k == "bos"]
        out.append({"Sequence": {"id": seq, "type_id": type_id}})
        return out + [{"SpecialToken": {"id": vocab.tokens[i], "type_id": type_id}} for k, i in specials if k == "eos"]

    return {
        "type": "TemplateProcessing",
        "single": template("A", 0),
        "pair": template("A", 0) + template("B", 1),
        "special_tokens": {vocab.tokens[i]: {"id": vocab.tokens[i], "ids": [i], "tokens": [vocab.tokens[i]]} for _, i in specials},
    }


def gguf_tokenizer_json(reader: Any) -> dict[str, Any]:
    """A Hugging Face `tokenizer.json` (as a dict) for the tokenizer embedded in a GGUF file.

    `reader` is a `GGUFModel` or its metadata mapping. SourceError for SentencePiece vocabularies
    and for `tokenizer.ggml.pre` names not in PRE_TOKENIZERS."""
    meta = _metadata(reader)
    embedded = meta.get(HF_JSON_KEY)
    if isinstance(embedded, str):
        try:
            doc = json.loads(embedded)
        except (ValueError, RecursionError):
            raise SourceError(f"GGUF {HF_JSON_KEY} is not valid JSON") from None
        if isinstance(doc, dict):
            return doc
    vocab = _Vocab(meta)
    pre_name = meta.get("tokenizer.ggml.pre", "gpt-2")
    pre = PRE_TOKENIZERS.get(pre_name) if isinstance(pre_name, str) else None
    if pre is None:
        raise SourceError(
            f"GGUF pre-tokenizer {pre_name!r} is not supported yet (supported: {', '.join(PRE_TOKENIZERS)}); "
            "use the model's Hugging Face tokenizer instead"
        )
    if pre.splits:
        steps = [{"type": "Split", "pattern": {"Regex": r}, "behavior": "Isolated", "invert": False} for r in pre.splits]
        pre_tokenizer: dict[str, Any] = {"type": "Sequence", "pretokenizers": [*steps, _byte_level(False)]}
    else:
        pre_tokenizer = _byte_level(True)
    added_ids = {a["id"] for a in vocab.added()}
    model_vocab: dict[str, int] = {}
    for i, t in enumerate(vocab.tokens):
        if i not in added_ids:
            model_vocab.setdefault(t, i)
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": vocab.added(),
        "normalizer": {"type": pre.normalizer} if pre.normalizer else None,
        "pre_tokenizer": pre_tokenizer,
        "post_processor": _post_processor(vocab),
        "decoder": _byte_level(True),
        "model": {
            "type": "BPE", "dropout": None, "unk_token": vocab.token("unknown_token_id"),
            "continuing_subword_prefix": None, "end_of_word_suffix": None, "fuse_unk": False,
            "byte_fallback": False, "ignore_merges": False, "vocab": model_vocab, "merges": vocab.merges,
        },
    }


def gguf_tokenizer_config(reader: Any, *, context_length: int | None = None) -> dict[str, Any]:
    """A Hugging Face `tokenizer_config.json` (as a dict): special tokens and the chat template."""
    meta = _metadata(reader)
    vocab = _Vocab(meta)
    config: dict[str, Any] = {
        "add_bos_token": bool(meta.get("tokenizer.ggml.add_bos_token", False)),
        "add_eos_token": bool(meta.get("tokenizer.ggml.add_eos_token", False)),
        "added_tokens_decoder": {str(a.pop("id")): a for a in vocab.added()},
        "bos_token": vocab.token("bos_token_id"),
        "eos_token": vocab.token("eos_token_id"),
        "pad_token": vocab.token("padding_token_id"),
        "unk_token": vocab.token("unknown_token_id"),
        "clean_up_tokenization_spaces": False,
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
    if context_length:
        config["model_max_length"] = context_length
    template = meta.get("tokenizer.chat_template")
    if isinstance(template, str):
        config["chat_template"] = template
    return config
