"""SentencePiece GGUF vocabularies (`tokenizer.ggml.model` "llama") as a `tokenizers` BPE pipeline.

llama.cpp runs these with its SPM tokenizer: a space is put before the text and after every
special token (`add_space_prefix`), every space becomes "▁", then adjacent symbols are merged
greedily, the pair whose merged piece scores highest first, and a symbol left outside the
vocabulary becomes its `<0xNN>` byte tokens. A BPE model with byte fallback whose merges are every
split of every piece into two pieces, ranked by the merged piece's score, merges the same way
(transformers rebuilds GGUF SentencePiece vocabularies as such a BPE too). The spaces come from a
Prepend + Replace normalizer, which the `tokenizers` library runs on each stretch of text between
added tokens: that is llama.cpp's space after a special token, and a text that starts with a space
keeps both. (A Metaspace pre-tokenizer, as transformers' LlamaTokenizer uses, adds no "▁" before
text that already starts with one, and with prepend_scheme "first" none after a special token.)
The decoder is the inverse, as in Llama's and Mistral's own tokenizer.json.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

SPACE = "\u2581"  # SentencePiece's visible space


def merges_from_scores(tokens: Sequence[str], scores: Sequence[float], mergeable: Sequence[bool]) -> list[list[str]]:
    """BPE merges that rebuild every mergeable piece from two mergeable pieces, best score first.

    `tokens[i]` is looked up as its last id, as llama.cpp looks it up. Only ordinary pieces
    (`mergeable`) take part: control, unknown and user-defined tokens are added tokens, cut out of
    the text before the model runs, and byte and unused tokens stand for no text of their own. Ties
    in score go to the longer left part, then the longer right part, then file order, as
    transformers' `generate_merges` orders them (real vocabularies score each piece differently)."""
    ids = {t: i for i, t in enumerate(tokens) if mergeable[i]}
    ranked: list[tuple[float, int, int, int, int, int, str, str]] = []
    for piece, i in ids.items():
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in ids and right in ids:
                ranked.append((-scores[i], -cut, cut - len(piece), i, ids[left], ids[right], left, right))
    ranked.sort()  # the ids make every key unique, so the strings are never compared
    return [[left, right] for *_, left, right in ranked]


def spm_normalizer(add_space_prefix: bool) -> dict[str, Any]:
    """Spaces as "▁", and one put before each stretch of text when `add_space_prefix`."""
    replace = {"type": "Replace", "pattern": {"String": " "}, "content": SPACE}
    if not add_space_prefix:
        return replace
    return {"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": SPACE}, replace]}


def spm_decoder(add_space_prefix: bool) -> dict[str, Any]:
    """"▁" back to spaces, byte tokens back to bytes, and the space the normalizer put first dropped."""
    steps: list[dict[str, Any]] = [
        {"type": "Replace", "pattern": {"String": SPACE}, "content": " "},
        {"type": "ByteFallback"},
        {"type": "Fuse"},
    ]
    if add_space_prefix:
        steps.append({"type": "Strip", "content": " ", "start": 1, "stop": 0})
    return {"type": "Sequence", "decoders": steps}


def spm_model(vocab: dict[str, int], merges: list[list[str]], unk_token: str | None) -> dict[str, Any]:
    """The BPE model: byte fallback for characters outside the vocabulary, runs of unknowns fused."""
    return {
        "type": "BPE", "dropout": None, "unk_token": unk_token, "continuing_subword_prefix": None,
        "end_of_word_suffix": None, "fuse_unk": True, "byte_fallback": True, "ignore_merges": False,
        "vocab": vocab, "merges": merges,
    }
