"""GGUF tokenizer metadata -> tokenizer.json, for the vocabulary layouts real files have.

Every token must come back at its file id. The layouts, as llama.cpp's convert_hf_to_gguf.py
writes them:
- Qwen3: byte-level tokens, then the added tokens (ChatML control tokens, `<think>`-style
  user-defined ones), then `[PAD{i}]` entries (type UNUSED) up to the embedding's rows;
- DeepSeek-V3: `<｜begin▁of▁sentence｜>`, `<｜end▁of▁sentence｜>`, `<｜▁pad▁｜>` at ids 0-2, then the
  byte-level tokens, then more added tokens;
- Mixtral: SentencePiece, `<unk>`, `<s>`, `</s>` at 0-2, the byte tokens `<0x00>`..`<0xFF>`, then
  pieces with scores.

The oracles: the tokenizer a GGUF is made from (same ids, same pipeline), transformers' own GGUF
tokenizer loader (`AutoTokenizer.from_pretrained(dir, gguf_file=...)`) where it supports the
layout, and for SentencePiece `llama_cpp_spm` (tests/gguf_vocab.py), a plain-Python twin of
llama.cpp's SPM tokenizer (llama-vocab.cpp), for the spaces at the start and after special tokens, where transformers'
Metaspace pre-tokenizer differs from llama.cpp.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from gguf.constants import Keys
from tokenizers import Tokenizer

from ftpull.tiny import CHAT_TEMPLATE, build_tiny_tokenizer
from ftw import SourceError
from ftw.gguf_file import GGUFModel
from ftw.gguf_tokenizer import PRE_TOKENIZERS, gguf_tokenizer_config, gguf_tokenizer_json
from runtime.text.tokenizer import Tokenizer as RuntimeTokenizer
from tests.gguf_vocab import (
    CONTROL,
    NORMAL,
    UNKNOWN,
    UNUSED,
    USER_DEFINED,
    export_byte_level,
    llama_cpp_spm,
    mixtral_layout,
    spm_trained,
    write_tokenizer_gguf,
)

TEXTS = [
    "Hello, world! It's 2025 and we'll test   spaces\n\nand newlines.\r\n",
    "<|im_start|>user\nWhat is 12345 * 678?<|im_end|>\n<think>\n</think>",
    "naïve café, 東京, Ελληνικά, emoji 🙂🚀👩‍💻 and tabs\there",
    "'S 'LL contractions' edge-cases... ---> ==> \u00a0",
    "[PAD1290] is text, not the padding token",
]
DEEPSEEK_SPECIALS = ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜▁pad▁｜>"]
DEEPSEEK_ADDED = {"<｜User｜>": True, "<｜Assistant｜>": True, "<think>": False, "</think>": False}
DEEPSEEK_TEMPLATE = ("{{ bos_token }}{% for m in messages %}{% if m['role'] == 'user' %}<｜User｜>{{ m['content'] }}"
                     "{% else %}<｜Assistant｜>{{ m['content'] }}<｜end▁of▁sentence｜>{% endif %}{% endfor %}"
                     "{% if add_generation_prompt %}<｜Assistant｜><think>\n{% endif %}")


def rebuilt(path: Path, out: Path | None = None) -> Tokenizer:
    """Our tokenizer.json for the GGUF at `path`, loaded; with `out`, both side files written there."""
    with GGUFModel(path) as model:
        doc, config = gguf_tokenizer_json(model), gguf_tokenizer_config(model)
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "tokenizer.json").write_text(json.dumps(doc))
        (out / "tokenizer_config.json").write_text(json.dumps(config))
    return Tokenizer.from_str(json.dumps(doc))


def plain(tokenizer: Tokenizer, text: str) -> list[int]:
    """`text`'s ids without the post-processor's BOS/EOS."""
    return tokenizer.encode(text, add_special_tokens=False).ids


def transformers_gguf(path: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name, local_files_only=True)


# -- byte-level BPE ---------------------------------------------------------------------------------


def deepseek_layout() -> Tokenizer:
    """The tiny byte-level BPE laid out as DeepSeek-V3's tokenizer.json: its specials at 0-2, the
    BPE tokens after them, more added tokens last, and DeepSeek-V3's pre-tokenizer (the regexes of
    its tokenizer.json, as ft's table holds them: the ids are under test here)."""
    doc = json.loads(build_tiny_tokenizer().to_str())
    bpe = sorted(doc["model"]["vocab"].items(), key=lambda kv: kv[1])
    tokens = DEEPSEEK_SPECIALS + [t for t, _ in bpe] + list(DEEPSEEK_ADDED)
    doc["model"]["vocab"] = {t: i for i, t in enumerate(tokens)}
    specials = {t: True for t in DEEPSEEK_SPECIALS} | DEEPSEEK_ADDED
    doc["added_tokens"] = [{"id": tokens.index(t), "content": t, "single_word": False, "lstrip": False, "rstrip": False,
                            "normalized": False, "special": special} for t, special in specials.items()]
    splits = [{"type": "Split", "pattern": {"Regex": r}, "behavior": "Isolated", "invert": False}
              for r in PRE_TOKENIZERS["deepseek-v3"].splits]
    doc["pre_tokenizer"]["pretokenizers"] = [*splits, doc["pre_tokenizer"]["pretokenizers"][-1]]
    return Tokenizer.from_str(json.dumps(doc))


def assert_same_ids(ours: Tokenizer, reference: Any, texts: list[str], *, hf: bool = False) -> None:
    for text in texts:
        want = reference.encode(text, add_special_tokens=False)
        want = want if hf else want.ids
        got = plain(ours, text)
        assert got == want, text
        assert ours.decode(got, skip_special_tokens=False) == text


def test_specials_not_last_keep_their_ids(tmp_path: Path) -> None:
    """The reproduction: specials first, a user-defined token and padding between and after the
    ordinary tokens. Before the fix the rebuilt tokenizer numbered the added tokens after the
    vocabulary: `<|im_start|>` came back as 15, the id of "cd", so "cd" decoded as a skipped
    special, and ids 0-2 decoded to nothing."""
    tokens = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", *"abcdefghij", "ab", "<think>", "cd", "[PAD16]", "[PAD17]"]
    types = [CONTROL] * 3 + [NORMAL] * 11 + [USER_DEFINED, NORMAL, UNUSED, UNUSED]
    path = write_tokenizer_gguf(tmp_path / "tok.gguf", tokens, types, pre="qwen2", merges=["a b", "c d"],
                                ids={"eos_token_id": 2})
    ours = rebuilt(path)
    text = "<|im_start|>abcd<think>cd<|im_end|>"
    assert plain(ours, text) == [1, 13, 15, 14, 15, 2]
    assert plain(ours, text) == transformers_gguf(path).encode(text, add_special_tokens=False)
    assert [ours.id_to_token(i) for i in range(len(tokens))] == tokens
    assert ours.decode([1, 3, 14, 2]) == "a<think>"  # specials skipped, the user-defined token kept


def test_qwen3_padded_layout(tmp_path: Path) -> None:
    """Specials after the ordinary tokens, then padding to the embedding's rows (Qwen3: 151,669
    tokens padded to 151,936): ids as the original tokenizer and transformers give them."""
    original = build_tiny_tokenizer()
    real = original.get_vocab_size(with_added_tokens=True)
    tokens, types, merges = export_byte_level(original, real + 37)
    path = write_tokenizer_gguf(tmp_path / "qwen3.gguf", tokens, types, pre="qwen2", merges=merges,
                                ids={"bos_token_id": original.token_to_id("<|endoftext|>"),
                                     "eos_token_id": original.token_to_id("<|im_end|>")},
                                flags={"add_bos_token": False}, template=CHAT_TEMPLATE)
    ours = rebuilt(path, tmp_path / "side")
    assert_same_ids(ours, original, TEXTS)
    assert_same_ids(ours, transformers_gguf(path), TEXTS, hf=True)
    assert [ours.id_to_token(i) for i in range(len(tokens))] == tokens
    assert ours.get_vocab_size() == real + 37 and ours.token_to_id(f"[PAD{real + 36}]") == real + 36

    runtime = RuntimeTokenizer.from_files(tmp_path / "side")
    messages = [{"role": "user", "content": "hi"}]
    assert runtime.encode_chat(messages) == transformers_gguf(path).apply_chat_template(
        messages, tokenize=True, add_generation_prompt=True, return_dict=False)
    assert runtime.encode_chat(messages)[0] == original.token_to_id("<|im_start|>")
    assert runtime.eos_token_ids == {original.token_to_id("<|im_end|>")}
    assert runtime.vocab_size == real + 37
    runtime.check_fits(real + 37)


def test_deepseek_specials_at_0_to_2(tmp_path: Path) -> None:
    """DeepSeek's `<｜begin▁of▁sentence｜>`... at 0-2 and its chat markup after the BPE tokens.
    transformers' loader re-spells control tokens outside the byte alphabet, so the oracle is the
    tokenizer the file is made from."""
    original = deepseek_layout()
    tokens, types, merges = export_byte_level(original, original.get_vocab_size(with_added_tokens=True))
    assert tokens[:3] == DEEPSEEK_SPECIALS and types[:3] == [CONTROL] * 3
    path = write_tokenizer_gguf(tmp_path / "ds.gguf", tokens, types, pre="deepseek-v3", merges=merges,
                                ids={"bos_token_id": 0, "eos_token_id": 1, "padding_token_id": 2},
                                flags={"add_bos_token": True}, template=DEEPSEEK_TEMPLATE)
    ours = rebuilt(path, tmp_path / "side")
    texts = [*TEXTS, "<｜begin▁of▁sentence｜><｜User｜>2+2?<｜Assistant｜><think>\nfour</think>4<｜end▁of▁sentence｜>"]
    assert_same_ids(ours, original, texts)
    assert ours.encode("hi", add_special_tokens=True).ids == [0, *original.encode("hi").ids]
    assert [ours.id_to_token(i) for i in range(len(tokens))] == tokens

    runtime = RuntimeTokenizer.from_files(tmp_path / "side")
    ids = runtime.encode_chat([{"role": "user", "content": "hi"}])
    user, assistant, think = (len(tokens) - 4, len(tokens) - 3, len(tokens) - 2)
    assert ids == [0, user, *original.encode("hi").ids, assistant, think, *original.encode("\n").ids]
    assert (runtime.bos_token_id, runtime.eos_token_ids) == (0, {1})
    assert runtime.decode(ids, skip_special_tokens=True) == "hi<think>\n"


# -- SentencePiece ----------------------------------------------------------------------------------


MixtralFile = tuple[Path, list[str], list[int], list[float]]  # the file, its tokens, types and scores
SPM_TEXTS = [
    "Hello, world! It's 2025 and we'll test   spaces\n\nand newlines.",
    "naïve café, 東京, Ελληνικά, emoji 🙂🚀👩‍💻 and\ttabs",
    "def f(x):\n    return x  # four spaces, two spaces",
    "a</s>",
    "unknown: ∮ ⅋",
]
# where llama.cpp (and Mistral's own tokenizer.json) put a "▁" that transformers' Metaspace does not
SPM_SPACE_TEXTS = [" leading space", "  two leading spaces", "<s>[INST] What is 2+2? [/INST] 4</s>[INST] and?",
                   "text<s>after a special"]


@pytest.fixture(scope="module")
def mixtral(tmp_path_factory: pytest.TempPathFactory) -> MixtralFile:
    tokens, types, scores = mixtral_layout()
    template = "{{ bos_token }}{% for m in messages %}[INST] {{ m['content'] }} [/INST]{% endfor %}"
    path = write_tokenizer_gguf(tmp_path_factory.mktemp("mixtral") / "mixtral.gguf", tokens, types, model="llama",
                                scores=scores, ids={"unknown_token_id": 0, "bos_token_id": 1, "eos_token_id": 2},
                                flags={"add_bos_token": True, "add_eos_token": False}, template=template)
    return path, tokens, types, scores


def test_sentencepiece_matches_transformers_and_llama_cpp(mixtral: MixtralFile) -> None:
    path, tokens, types, scores = mixtral
    ours, hf = rebuilt(path), transformers_gguf(path)
    for text in SPM_TEXTS:
        got = plain(ours, text)
        assert got == hf.encode(text, add_special_tokens=False), text
        assert got == llama_cpp_spm(text, tokens, types, scores), text
        assert ours.encode(text, add_special_tokens=True).ids == hf.encode(text) == [1, *got]
        assert ours.decode(got, skip_special_tokens=False) == hf.decode(got) == text
    for text in SPM_SPACE_TEXTS:
        assert plain(ours, text) == llama_cpp_spm(text, tokens, types, scores), text
    assert plain(ours, "東") == [tokens.index("▁"), *(3 + b for b in "東".encode())]  # bytes: 3 + b
    assert [ours.id_to_token(i) for i in range(len(tokens))] == tokens
    ids = plain(ours, "<s>[INST] hi [/INST]")
    assert ours.decode(ids) == hf.decode(ids, skip_special_tokens=True) == "[INST] hi [/INST]"


def test_sentencepiece_chat_and_side_files(mixtral: MixtralFile, tmp_path: Path) -> None:
    path, tokens, types, scores = mixtral
    rebuilt(path, tmp_path)
    runtime = RuntimeTokenizer.from_files(tmp_path)
    messages = [{"role": "user", "content": "What is 2+2?"}]
    prompt = runtime.apply_chat_template(messages)
    assert prompt == "<s>[INST] What is 2+2? [/INST]"
    assert runtime.encode_chat(messages) == llama_cpp_spm(prompt, tokens, types, scores)
    assert (runtime.bos_token_id, runtime.eos_token_ids, runtime.add_bos_token) == (1, {2}, True)
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert (config["unk_token"], config["add_bos_token"]) == ("<unk>", True)
    assert {k: v["special"] for k, v in config["added_tokens_decoder"].items()} == {"0": True, "1": True, "2": True}


def test_sentencepiece_without_space_prefix_or_flags(tmp_path: Path) -> None:
    """`add_space_prefix` false: no "▁" put first; no add_bos_token key: a BOS, as llama.cpp adds."""
    tokens, types, scores = mixtral_layout()
    path = write_tokenizer_gguf(tmp_path / "spm.gguf", tokens, types, model="llama", scores=scores,
                                ids={"bos_token_id": 1, "eos_token_id": 2}, flags={"add_space_prefix": False})
    ours = rebuilt(path)
    for text in SPM_TEXTS + SPM_SPACE_TEXTS:
        want = llama_cpp_spm(text, tokens, types, scores, add_space_prefix=False)
        assert plain(ours, text) == want, text
        assert ours.decode(plain(ours, text), skip_special_tokens=False) == text
    assert ours.encode("hi", add_special_tokens=True).ids[0] == 1


def test_sentencepiece_merges_from_the_file() -> None:
    """A SentencePiece file that lists merges (taken from a tokenizer.json) and no scores: the
    merges the vocabulary was trained with give the same ids as the scores do."""
    tokens, types, scores = mixtral_layout()
    meta = {Keys.Tokenizer.MODEL: "llama", Keys.Tokenizer.LIST: tokens, Keys.Tokenizer.TOKEN_TYPE: types}
    trained = ["▁ ▁", "▁▁ ▁▁"] + [" ".join(pair) for pair in json.loads(spm_trained().to_str())["model"]["merges"]]
    from_merges = Tokenizer.from_str(json.dumps(gguf_tokenizer_json({**meta, Keys.Tokenizer.MERGES: trained})))
    from_scores = Tokenizer.from_str(json.dumps(gguf_tokenizer_json({**meta, Keys.Tokenizer.SCORES: scores})))
    for text in SPM_TEXTS + SPM_SPACE_TEXTS:
        assert plain(from_merges, text) == plain(from_scores, text) == llama_cpp_spm(text, tokens, types, scores), text


def test_sentencepiece_control_tokens_and_padding_between(tmp_path: Path) -> None:
    """Mistral v3's layout: `[INST]`/`[/INST]` control tokens at 3-4 before the byte tokens, a
    user-defined token and `[PAD{i}]` padding after the pieces: all at their ids, the byte tokens
    still found by name."""
    tokens, types, scores = mixtral_layout()
    tokens = tokens[:3] + ["[INST]", "[/INST]"] + tokens[3:] + ["<tool>"] + [f"[PAD{len(tokens) + 3 + i}]" for i in range(5)]
    types = types[:3] + [CONTROL, CONTROL] + types[3:] + [USER_DEFINED] + [UNUSED] * 5
    scores = scores[:3] + [0.0, 0.0] + scores[3:] + [0.0] * 6
    path = write_tokenizer_gguf(tmp_path / "v3.gguf", tokens, types, model="llama", scores=scores,
                                ids={"unknown_token_id": 0, "bos_token_id": 1, "eos_token_id": 2})
    ours = rebuilt(path)
    for text in [*SPM_TEXTS, *SPM_SPACE_TEXTS, "<s>[INST] call<tool>[/INST] [PAD1000]"]:
        assert plain(ours, text) == llama_cpp_spm(text, tokens, types, scores), text
    assert plain(ours, "[INST]\n")[:2] == [3, tokens.index("▁")]
    assert [ours.id_to_token(i) for i in range(len(tokens))] == tokens
    ids = plain(ours, "[INST] hi<tool>[/INST]")
    # the "▁" put after a special token decodes as a space, as with Mistral's own tokenizer.json
    assert ours.decode(ids) == " hi<tool>" and ours.decode(ids, skip_special_tokens=False) == "[INST]  hi<tool>[/INST]"


# -- bad metadata -----------------------------------------------------------------------------------


def _meta(**changes: Any) -> dict[str, Any]:
    meta = {Keys.Tokenizer.MODEL: "llama", Keys.Tokenizer.LIST: ["<unk>", "<s>", "▁a", "▁", "a"],
            Keys.Tokenizer.TOKEN_TYPE: [UNKNOWN, CONTROL, NORMAL, NORMAL, NORMAL],
            Keys.Tokenizer.SCORES: [0.0, 0.0, -1.0, -2.0, -3.0], Keys.Tokenizer.BOS_ID: 1}
    return {**meta, **{getattr(Keys.Tokenizer, k): v for k, v in changes.items()}}


@pytest.mark.parametrize(("changes", "message"), [
    ({"TOKEN_TYPE": [1, 1]}, r"token_type has 2 entries but tokenizer.ggml.tokens has 5"),
    ({"TOKEN_TYPE": "1 1 1 1 1"}, r"token_type has a str but"),
    ({"TOKEN_TYPE": [2, 3, 1, 1, 9]}, r"token_type\[4\] is 9, not a token type"),
    ({"SCORES": [0.0, 0.0, math.nan, 0.0, 0.0]}, r"scores\[2\] is nan, not a finite number"),
    ({"SCORES": [0.0]}, r"scores has 1 entries"),
    ({"BOS_ID": 5}, r"bos_token_id = 5 is not a token id \(the vocabulary has 5\)"),
    ({"EOS_ID": -1}, r"eos_token_id = -1 is not a token id"),
    ({"LIST": ["<unk>", 7, "▁a", "▁", "a"]}, r"tokens\[1\] is 7, not a string"),
    ({"LIST": []}, r"tokens is missing or empty"),
    ({"SCORES": None}, r"has neither tokenizer.ggml.scores nor tokenizer.ggml.merges"),
    ({"MERGES": ["▁ b"], "SCORES": None}, r"merges\[0\] \('▁' \+ 'b'\) names a token the vocabulary lacks"),
    ({"MERGES": ["▁a"]}, r"merges is not a list of 'left right' strings"),
    ({"ADD_BOS": "yes"}, r"add_bos_token is 'yes', not true or false"),
    ({"MODEL": "bert"}, r"tokenizer model 'bert' is not supported yet"),
])
def test_bad_metadata_is_a_source_error(changes: dict[str, Any], message: str) -> None:
    meta = _meta(**changes)
    with pytest.raises(SourceError, match=message):
        gguf_tokenizer_json(meta)
    with pytest.raises(SourceError, match=message):
        gguf_tokenizer_config(meta)


def test_bad_metadata_in_a_file(tmp_path: Path) -> None:
    """Read back from a file as the converter reads it: types shorter than the tokens."""
    path = write_tokenizer_gguf(tmp_path / "bad.gguf", ["a", "b", "<s>"], [NORMAL, CONTROL], pre="qwen2")
    with GGUFModel(path) as model, pytest.raises(SourceError, match="token_type has 2 entries but .* has 3"):
        gguf_tokenizer_json(model)


def test_empty_and_repeated_tokens_load() -> None:
    """As llama.cpp reads them: an empty token is named `[EMPTY_i]`, a repeated string means its last id."""
    meta = _meta(LIST=["<unk>", "<s>", "▁a", "", "▁a", "▁", "a"], TOKEN_TYPE=[UNKNOWN, CONTROL] + [NORMAL] * 5,
                 SCORES=[0.0, 0.0, -1.0, 0.0, -1.5, -2.0, -3.0])
    ours = Tokenizer.from_str(json.dumps(gguf_tokenizer_json(meta)))
    assert ours.token_to_id("[EMPTY_3]") == 3 and ours.token_to_id("▁a") == 4
    assert plain(ours, "a") == [4]


def test_llama_cpp_names_of_one_regex_rebuild_alike() -> None:
    """llama-vocab.cpp gives GLM-4.5's glm4, DBRX's dbrx and llama3 Llama 3's regex, and OLMoE's olmo
    GPT-2's: a file naming any of them is rebuilt (GLM, DBRX and OLMoE GGUFs were refused). It takes a
    piece that is a token whole for Llama 3's names, LFM2's and GLM-4.5/5's, not for DBRX's, Smaug's or
    chatglm-bpe."""
    for name in ("llama3", "llama-v3", "dbrx", "smaug-bpe", "glm4", "glm5", "chatglm-bpe", "lfm2"):
        assert PRE_TOKENIZERS[name].splits == PRE_TOKENIZERS["llama-bpe"].splits, name
        assert PRE_TOKENIZERS[name].ignore_merges == (name not in ("dbrx", "smaug-bpe", "chatglm-bpe")), name
    assert PRE_TOKENIZERS["olmo"] == PRE_TOKENIZERS["gpt-2"]


@pytest.mark.parametrize(("pre", "whole"), [("llama-bpe", True), ("glm4", True), ("tekken", True), ("lfm2", True),
                                            ("dbrx", False), ("qwen2", False), ("gpt-4o", False)])
def test_a_piece_that_is_a_token_is_taken_whole_where_llama_cpp_ignores_merges(tmp_path: Path, pre: str,
                                                                                whole: bool) -> None:
    """llama-vocab.cpp's ignore_merges (Llama 3, LFM2, GLM-4.5/5, tekken; Llama 3's tokenizer.json too):
    a pre-tokenized piece that is itself a token is that token, whether or not a merge builds it. Here
    "abc" is a token no merge makes ("a b" only): taken whole, or split as the merges leave it."""
    tokens = ["a", "b", "c", "ab", "abc", "<|endoftext|>"]
    path = write_tokenizer_gguf(tmp_path / f"{pre}.gguf", tokens, [NORMAL] * 5 + [CONTROL], pre=pre,
                                merges=["a b"], ids={"eos_token_id": 5})
    ids = rebuilt(path).encode("abc", add_special_tokens=False).ids
    assert ids == ([4] if whole else [3, 2])


def test_gpt_4o_pre_tokenizer_splits_as_o200k(tmp_path: Path) -> None:
    """gpt-oss's, Llama 4's and MiniMax-M2's files name "gpt-4o" (or their own name for it): o200k's
    split keeps a contraction on its word, parts camel case and groups digits in threes, where
    Llama 3's regex would keep "HelloWorld" whole and "'s" apart."""
    tokens = ["a", "b", "<|endoftext|>"]
    path = write_tokenizer_gguf(tmp_path / "o200k.gguf", tokens, [NORMAL, NORMAL, CONTROL], pre="gpt-4o", merges=[],
                                ids={"eos_token_id": 2})
    tokenizer = rebuilt(path)
    pieces = [piece for piece, _ in tokenizer.pre_tokenizer.pre_tokenize_str("HelloWorld's 12345 ok?!\n\nNEXT")]
    assert pieces == ["Hello", "World's", "Ġ", "123", "45", "Ġok", "?!ĊĊ", "NEXT"]  # (line ends stay on the punctuation)
    for name in ("llama4", "minimax-m2"):
        assert PRE_TOKENIZERS[name] == PRE_TOKENIZERS["gpt-4o"], name


def test_exaone_moe_pre_tokenizer_joins_words_across_single_spaces(tmp_path: Path) -> None:
    """K-EXAONE's files name "exaone-moe": its tokenizer.json's regex (llama-vocab.cpp quotes it) keeps
    a run of words one piece across single spaces, digits one by one, and one line end on punctuation."""
    tokens = ["a", "b", "<|endoftext|>"]
    path = write_tokenizer_gguf(tmp_path / "exaone.gguf", tokens, [NORMAL, NORMAL, CONTROL], pre="exaone-moe",
                                merges=[], ids={"eos_token_id": 2})
    pieces = [piece for piece, _ in rebuilt(path).pre_tokenizer.pre_tokenize_str("Hello big world's 123 ok?!\n\nNEXT")]
    assert pieces == ["HelloĠbigĠworld", "'s", "Ġ", "1", "2", "3", "Ġok", "?!Ċ", "Ċ", "NEXT"]  # (as the regex module splits)


def test_afmoe_pre_tokenizer_groups_digits_from_the_right(tmp_path: Path) -> None:
    """Arcee Trinity's files name "afmoe": llama.cpp splits digit runs into threes from the right
    (unicode.cpp's custom AFMoE split: 1234567 is 1, 234, 567), then isolates runs of CJK, then
    DeepSeek-V3's word regex; the rebuilt pipeline does the same with a lookahead."""
    tokens = ["a", "b", "<|endoftext|>"]
    path = write_tokenizer_gguf(tmp_path / "afmoe.gguf", tokens, [NORMAL, NORMAL, CONTROL], pre="afmoe", merges=[],
                                ids={"eos_token_id": 2})
    pieces = [piece for piece, _ in rebuilt(path).pre_tokenizer.pre_tokenize_str("Price 1234567 and 12,5 日本語 ok!")]
    assert pieces == ["Price", "Ġ", "1", "234", "567", "Ġand", "Ġ", "12", ",", "5", "Ġ", "æĹ¥æľ¬èªŀ", "Ġok", "!"]


def test_sarvam_moe_tokenizer_merges_raw_text_with_escaped_spaces(tmp_path: Path) -> None:
    """Sarvam-30B's files name "sarvam-moe": a 'gpt2' vocabulary that llama.cpp runs SentencePiece-style
    (byte_encode false, escape_whitespaces): spaces become ▁, lines and runs of newlines split apart,
    merges over raw UTF-8, a character with no token spelled by its <0xXX> byte tokens."""
    tokens = ["<unk>", "<|endoftext|>", "▁", "h", "i", "hi", "▁hi", "\n", "<0xC3>", "<0xA9>"]
    path = write_tokenizer_gguf(tmp_path / "sarvam.gguf", tokens, [UNKNOWN, CONTROL] + [NORMAL] * 8, pre="sarvam-moe",
                                merges=["h i", "▁ hi"], ids={"eos_token_id": 1, "unknown_token_id": 0})
    ours = rebuilt(path)
    ids = plain(ours, "hi hi\n\né")
    assert ids == [5, 6, 7, 7, 8, 9]
    assert ours.decode(ids) == "hi hi\n\né"


def test_tekken_pre_tokenizer_splits_as_mistral_s(tmp_path: Path) -> None:
    """Mistral Small 4's files (and Mistral NeMo's, Small 3.x's) name "tekken": its tokenizer.json's regex,
    o200k's cased words without their contraction and every digit alone."""
    tokens = ["a", "b", "</s>"]
    path = write_tokenizer_gguf(tmp_path / "tekken.gguf", tokens, [NORMAL, NORMAL, CONTROL], pre="tekken", merges=[],
                                ids={"eos_token_id": 2})
    pieces = [piece for piece, _ in rebuilt(path).pre_tokenizer.pre_tokenize_str("HelloWorld's 12345 ok?!\n\nNEXT")]
    assert pieces == ["Hello", "World", "'s", "Ġ", "1", "2", "3", "4", "5", "Ġok", "?!ĊĊ", "NEXT"]
