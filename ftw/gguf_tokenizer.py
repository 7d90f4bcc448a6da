"""The tokenizer a GGUF file embeds, rebuilt as Hugging Face `tokenizer.json` + `tokenizer_config.json`.

GGUF keeps the vocabulary (`tokenizer.ggml.tokens`, `.token_type`, `.merges` or `.scores`, the
special ids) but not the pipeline around it. Every token keeps its file id, because the model knows
only ids and real files put special tokens anywhere: DeepSeek's at 0-2, Qwen3's after the ordinary
tokens and before the `[PAD…]` entries that pad the vocabulary to the embedding's rows. Control and
unknown tokens become special added tokens and user-defined ones (`<think>`) plain added tokens, so
both are matched whole; padding (unused) tokens stay plain vocabulary entries, as llama.cpp never
matches them in text.

- Byte-level BPE (`tokenizer.ggml.model` "gpt2"): `tokenizer.ggml.pre` only names the
  pre-tokenizer, and llama.cpp's llama-vocab.cpp maps the name to regexes. PRE_TOKENIZERS
  (gguf_pretokenizers) maps the names we know to the pipeline of the model's original tokenizer.
- SentencePiece ("llama": Llama, Mistral, Mixtral and many more): a BPE with byte fallback whose
  merges are the file's, or else derived from the scores; see gguf_tokenizer_spm.
- Gemma 4's ("gemma4", Gemma4Model's set_vocab from tokenizer.json): SentencePiece-style BPE with
  the file's merges, which llama-vocab.cpp runs as the "gemma4" pre-tokenizer whatever
  `tokenizer.ggml.pre` says (spaces as U+2581, lines and runs of newlines apart, raw UTF-8, <0xXX>
  byte fallback), always adding BOS. A run of newlines that is itself a token is taken whole
  (llama.cpp's fix for Gemma 4): those tokens are matched as added tokens, which is the same for
  every run the vocabulary has (a longer run is cut at its longest token, where llama.cpp merges it).

Other tokenizer models are refused. A file that embeds its tokenizer.json verbatim
(`tokenizer.huggingface.json`) is taken as is.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from typing import Any

from .errors import SourceError
from .gguf_pretokenizers import PRE_TOKENIZERS
from .gguf_tokenizer_spm import merges_from_scores, spm_decoder, spm_model, spm_normalizer

# gguf-py TokenType
UNDEFINED, NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 0, 1, 2, 3, 4, 5, 6
SUPPORTED_MODELS = ("gpt2", "llama", "gemma4")  # tokenizer.ggml.model
TOKENS, TYPES, SCORES, MERGES = (
    "tokenizer.ggml.tokens", "tokenizer.ggml.token_type", "tokenizer.ggml.scores", "tokenizer.ggml.merges")
SPECIAL_ID_KEYS = ("bos_token_id", "eos_token_id", "unknown_token_id", "padding_token_id")  # tokenizer.ggml.*
# llama.cpp's special ids for a SentencePiece vocabulary whose file names none
_SPM_DEFAULT_IDS = {"unknown_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}
_DAMAGED = "the file's tokenizer metadata is damaged; re-download it, or use the model's Hugging Face tokenizer"

HF_JSON_KEY = "tokenizer.huggingface.json"


def _metadata(reader: Any) -> Mapping[str, Any]:
    return reader.metadata if hasattr(reader, "metadata") else reader


class _Vocab:
    """The validated `tokenizer.ggml.*` arrays; SourceError naming the key for anything malformed."""

    def __init__(self, meta: Mapping[str, Any]) -> None:
        self.meta = meta
        self.model = meta.get("tokenizer.ggml.model")
        if self.model not in SUPPORTED_MODELS:
            raise SourceError(
                f"GGUF tokenizer model {self.model!r} is not supported yet: ft rebuilds byte-level BPE ('gpt2'), "
                "SentencePiece ('llama') and Gemma 4's ('gemma4') tokenizers only; use the model's Hugging Face "
                "tokenizer instead"
            )
        tokens = meta.get(TOKENS)
        if not isinstance(tokens, list) or not tokens:
            raise SourceError(f"GGUF {TOKENS} is missing or empty; {_DAMAGED}")
        bad = next((i for i, t in enumerate(tokens) if not isinstance(t, str)), None)
        if bad is not None:
            raise SourceError(f"GGUF {TOKENS}[{bad}] is {tokens[bad]!r}, not a string; {_DAMAGED}")
        # an empty string cannot be looked up; llama.cpp names such an entry the same way
        self.tokens: list[str] = [t or f"[EMPTY_{i}]" for i, t in enumerate(tokens)]
        # where the list repeats a string, the string means its last id, as in llama.cpp
        self.ids: dict[str, int] = {t: i for i, t in enumerate(self.tokens)}
        types = self._per_token(TYPES, lambda v: isinstance(v, int) and UNDEFINED <= v <= BYTE, "a token type (0-6)")
        self.types: list[int] = types if types is not None else [NORMAL] * len(self.tokens)
        self.scores: list[float] | None = self._per_token(
            SCORES, lambda v: isinstance(v, (int, float)) and math.isfinite(v), "a finite number")
        merges = meta.get(MERGES) or []
        if not isinstance(merges, list) or not all(isinstance(m, str) and m.find(" ", 1) > 0 for m in merges):
            raise SourceError(f"GGUF {MERGES} is not a list of 'left right' strings; {_DAMAGED}")
        # llama.cpp splits at the first space after the first character (a token may be one space)
        self.merges = [[m[: m.index(" ", 1)], m[m.index(" ", 1) + 1 :]] for m in merges]
        for n, (left, right) in enumerate(self.merges):
            if left not in self.ids or right not in self.ids or left + right not in self.ids:
                raise SourceError(f"GGUF {MERGES}[{n}] ({left!r} + {right!r}) names a token the vocabulary lacks; "
                                  f"{_DAMAGED}")
        if self.model == "llama" and self.scores is None and not self.merges:
            raise SourceError(f"GGUF SentencePiece vocabulary has neither {SCORES} nor {MERGES}; {_DAMAGED}")
        for key in SPECIAL_ID_KEYS:
            self.token_id(key)

    def _per_token(self, key: str, valid: Callable[[Any], bool], what: str) -> list[Any] | None:
        """The array `key`, one entry per token and each `valid`; None where the file has none."""
        value = self.meta.get(key)
        if value is None:
            return None
        if not isinstance(value, list) or len(value) != len(self.tokens):
            size = f"{len(value)} entries" if isinstance(value, list) else f"a {type(value).__name__}"
            raise SourceError(f"GGUF {key} has {size} but {TOKENS} has {len(self.tokens)}; {_DAMAGED}")
        bad = next((i for i, v in enumerate(value) if isinstance(v, bool) or not valid(v)), None)
        if bad is not None:
            raise SourceError(f"GGUF {key}[{bad}] is {value[bad]!r}, not {what}; {_DAMAGED}")
        return value

    def token_id(self, key: str) -> int | None:
        value = self.meta.get(f"tokenizer.ggml.{key}")
        if value is None:  # llama.cpp's defaults for SentencePiece vocabularies
            default = _SPM_DEFAULT_IDS.get(key) if self.model == "llama" else None
            return default if default is not None and default < len(self.tokens) else None
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < len(self.tokens):
            raise SourceError(f"GGUF tokenizer.ggml.{key} = {value!r} is not a token id (the vocabulary has "
                              f"{len(self.tokens)}); {_DAMAGED}")
        return value

    def token(self, key: str) -> str | None:
        i = self.token_id(key)
        return None if i is None else self.tokens[i]

    def flag(self, key: str) -> bool:
        """`tokenizer.ggml.{key}`, or llama.cpp's default: a BOS and a space prefix for SentencePiece."""
        value = self.meta.get(f"tokenizer.ggml.{key}")
        if self.model == "gemma4" and key == "add_bos_token":
            return True  # llama-vocab.cpp overrides a false one for Gemma 4
        if value is None:
            return self.model == "llama" and key in ("add_bos_token", "add_space_prefix")
        if not isinstance(value, int):  # bool is an int; some writers store 0/1
            raise SourceError(f"GGUF tokenizer.ggml.{key} is {value!r}, not true or false; {_DAMAGED}")
        return bool(value)

    def added(self) -> list[dict[str, Any]]:
        """Control, unknown and user-defined tokens at their file ids; user-defined ones are not special.
        For Gemma 4, its runs of newlines too (not special), which llama.cpp takes whole."""
        return [
            {"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False,
             "special": kind in (CONTROL, UNKNOWN)}
            for i, (t, kind) in enumerate(zip(self.tokens, self.types, strict=True))
            if (kind in (CONTROL, UNKNOWN, USER_DEFINED) or self._newline_run(t, kind)) and self.ids[t] == i
        ]

    def _newline_run(self, token: str, kind: int) -> bool:
        return self.model == "gemma4" and kind in (UNDEFINED, NORMAL) and token != "" and token.strip("\n") == ""

    def vocab(self) -> dict[str, int]:
        """Every token at its file id, added and padding tokens included."""
        return {t: i for i, t in enumerate(self.tokens) if self.ids[t] == i}


def _byte_level(use_regex: bool) -> dict[str, Any]:
    return {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": use_regex}


def _post_processor(vocab: _Vocab) -> dict[str, Any] | None:
    """BOS/EOS added as `tokenizer.ggml.add_bos_token`/`add_eos_token` say, else none (byte-level: plain ByteLevel)."""
    specials = []
    if vocab.flag("add_bos_token") and (bos := vocab.token_id("bos_token_id")) is not None:
        specials.append(("bos", bos))
    if vocab.flag("add_eos_token") and (eos := vocab.token_id("eos_token_id")) is not None:
        specials.append(("eos", eos))
    if not specials:
        return _byte_level(False) if vocab.model == "gpt2" else None

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


def _byte_level_pipeline(vocab: _Vocab) -> dict[str, Any]:
    # (llama-vocab.cpp sets Gemma 4's pre-tokenizer itself, whatever the file says)
    pre_name = "gemma4" if vocab.model == "gemma4" else vocab.meta.get("tokenizer.ggml.pre", "gpt-2")
    pre = PRE_TOKENIZERS.get(pre_name) if isinstance(pre_name, str) else None
    if pre is None:
        raise SourceError(
            f"GGUF pre-tokenizer {pre_name!r} is not supported yet (supported: {', '.join(PRE_TOKENIZERS)}); "
            "use the model's Hugging Face tokenizer instead"
        )
    steps = [{"type": "Split", "pattern": {"Regex": r}, "behavior": "Isolated", "invert": False} for r in pre.splits]
    model = {
        "type": "BPE", "dropout": None, "unk_token": vocab.token("unknown_token_id"),
        "continuing_subword_prefix": None, "end_of_word_suffix": None, "fuse_unk": False,
        "byte_fallback": not pre.byte_level, "ignore_merges": pre.ignore_merges, "vocab": vocab.vocab(),
        "merges": vocab.merges,
    }
    if not pre.byte_level:
        return {
            "normalizer": {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"},
            "pre_tokenizer": {"type": "Sequence", "pretokenizers": steps},
            "decoder": {"type": "Sequence", "decoders": [
                {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
                {"type": "ByteFallback"}, {"type": "Fuse"}]},
            "model": model,
        }
    if pre.splits:
        pre_tokenizer: dict[str, Any] = {"type": "Sequence", "pretokenizers": [*steps, _byte_level(False)]}
    else:
        pre_tokenizer = _byte_level(True)
    return {
        "normalizer": {"type": pre.normalizer} if pre.normalizer else None,
        "pre_tokenizer": pre_tokenizer,
        "decoder": _byte_level(True),
        "model": model,
    }


def _sentencepiece_pipeline(vocab: _Vocab) -> dict[str, Any]:
    if vocab.merges:  # a file's own merges are its tokenizer.json's, as transformers takes them too
        merges = vocab.merges
    else:  # what llama.cpp merges by
        assert vocab.scores is not None
        merges = merges_from_scores(vocab.tokens, vocab.scores, [kind in (UNDEFINED, NORMAL) for kind in vocab.types])
    unk = vocab.token("unknown_token_id")
    if unk is None:
        unk = next((t for t, kind in zip(vocab.tokens, vocab.types, strict=True) if kind == UNKNOWN), None)
    space_prefix = vocab.flag("add_space_prefix")
    return {
        "normalizer": spm_normalizer(space_prefix),
        "pre_tokenizer": None,
        "decoder": spm_decoder(space_prefix),
        "model": spm_model(vocab.vocab(), merges, unk),
    }


def gguf_tokenizer_json(reader: Any) -> dict[str, Any]:
    """A Hugging Face `tokenizer.json` (as a dict) for the tokenizer embedded in a GGUF file.

    `reader` is a `GGUFModel` or its metadata mapping. Every token keeps its file id. SourceError
    for tokenizer models other than 'gpt2', 'llama' and 'gemma4', for `tokenizer.ggml.pre` names not in
    PRE_TOKENIZERS, and for malformed tokenizer metadata."""
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
    pipeline = _sentencepiece_pipeline(vocab) if vocab.model == "llama" else _byte_level_pipeline(vocab)
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": vocab.added(),
        "normalizer": pipeline["normalizer"],
        "pre_tokenizer": pipeline["pre_tokenizer"],
        "post_processor": _post_processor(vocab),
        "decoder": pipeline["decoder"],
        "model": pipeline["model"],
    }


def gguf_tokenizer_config(reader: Any, *, context_length: int | None = None) -> dict[str, Any]:
    """A Hugging Face `tokenizer_config.json` (as a dict): special tokens and the chat template."""
    meta = _metadata(reader)
    vocab = _Vocab(meta)
    config: dict[str, Any] = {
        "add_bos_token": vocab.flag("add_bos_token"),
        "add_eos_token": vocab.flag("add_eos_token"),
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
