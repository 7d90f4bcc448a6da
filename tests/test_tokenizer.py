"""runtime.text.tokenizer against transformers' AutoTokenizer on the same files.

Tiny tokenizer directories in the layout of each family (the built-in tiny Qwen3-MoE; Qwen3.5
with chat_template.jinja; DeepSeek-V3 with AddedToken dicts and a BOS post-processor; GLM with a
list of named templates; Mixtral with a legacy special_tokens_map.json), built offline from the
tiny byte-level BPE plus the family's special tokens and its real chat template. For each, the
chat text and ids, encode/decode, special tokens and vocabulary size must equal transformers'.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
from tokenizers import AddedToken, processors
from transformers import AutoTokenizer

from ftpull.tiny import IM_END_ID, build_tiny_checkpoint, build_tiny_tokenizer
from registry import ANNOTATION_TITLE, Manifest, Store
from runtime.loading.registered import (
    MEDIA_CONFIG,
    MEDIA_FILE,
    MEDIA_FTW_INDEX,
    MEDIA_FTW_SHARD,
    MEDIA_TEMPLATE,
    open_model,
)
from runtime.text.chat_template import ChatTemplateError
from runtime.text.detokenize import REPLACEMENT_CHAR, IncrementalDetokenizer, StopStringMatcher
from runtime.text.tokenizer import Tokenizer, TokenizerError
from tests.test_chat_template import CASES, TEMPLATE_DIR, WEATHER_TOOL

DEEPSEEK_SPECIALS = ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>",
                     "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>",
                     "<｜tool▁sep｜>", "<｜tool▁outputs▁begin｜>", "<｜tool▁outputs▁end｜>", "<｜tool▁output▁begin｜>",
                     "<｜tool▁output▁end｜>"]
GLM_SPECIALS = ["[gMASK]", "<sop>", "<|system|>", "<|user|>", "<|assistant|>", "<|observation|>", "<arg_key>",
                "</arg_key>", "<arg_value>", "</arg_value>"]
TEXTS = ["Hello world", "  leading spaces and\ttabs\n\nnewlines", "中文 😀 «ü»", "<|im_start|>user\nhi<|im_end|>",
         "<｜begin▁of▁sentence｜>x<｜User｜>", "[gMASK]<sop><|user|>hey", "<s> [INST] q [/INST]</s>", ""]


def _template(name: str) -> str:
    return (TEMPLATE_DIR / f"{name}.jinja").read_text(encoding="utf-8")


def _added(content: str, special: bool = True) -> dict[str, Any]:
    return {"content": content, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False,
            "special": special}


def _write_json(path: Path, obj: Any) -> None:
    path.write_text(json.dumps(obj, ensure_ascii=False, indent=1), encoding="utf-8")


def make_model_dir(root: Path, family: str) -> Path:
    """A tokenizer directory in `family`'s layout (see the module docstring)."""
    directory = root / family
    if family == "tiny":
        return build_tiny_checkpoint(directory)
    directory.mkdir(parents=True)
    backend = build_tiny_tokenizer()  # ChatML specials and <think>/<tool_call> markup included
    specials = {"deepseek_v3": DEEPSEEK_SPECIALS, "glm": GLM_SPECIALS, "mixtral": ["<unk>", "<s>", "</s>"]}
    backend.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in specials.get(family, [])])
    decoder = {str(i): _added(t.content, t.special) for i, t in backend.get_added_tokens_decoder().items()}
    config: dict[str, Any] = {"tokenizer_class": "PreTrainedTokenizerFast", "clean_up_tokenization_spaces": False,
                              "added_tokens_decoder": decoder}
    if family == "qwen3_5":
        config.update(eos_token="<|im_end|>", pad_token="<|endoftext|>", bos_token=None,
                      chat_template="{{ 'config template: loses to chat_template.jinja' }}")
        (directory / "chat_template.jinja").write_text(_template("qwen3_5"), encoding="utf-8")
        _write_json(directory / "generation_config.json", {"eos_token_id": [IM_END_ID, IM_END_ID - 2]})
    elif family == "deepseek_v3":
        bos, eos = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"
        backend.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A $B", special_tokens=[(bos, backend.token_to_id(bos))])
        config.update(add_bos_token=True, chat_template=_template("deepseek_v3"),
                      bos_token={"__type": "AddedToken", **_added(bos)}, eos_token={"__type": "AddedToken", **_added(eos)},
                      pad_token={"__type": "AddedToken", **_added(eos)})
        _write_json(directory / "generation_config.json", {"bos_token_id": 0, "eos_token_id": backend.token_to_id(eos)})
    elif family == "glm":
        config.update(eos_token="<|endoftext|>", pad_token="<|endoftext|>", chat_template=[
            {"name": "default", "template": _template("glm_5_3_flash")},
            {"name": "tool_use", "template": _template("glm_4_5")}])
        stops = [backend.token_to_id(t) for t in ("<|endoftext|>", "<|user|>", "<|observation|>")]
        _write_json(directory / "generation_config.json", {"eos_token_id": stops})
    elif family == "mixtral":  # a legacy layout: special tokens only in special_tokens_map.json
        del config["added_tokens_decoder"]
        backend.post_processor = processors.TemplateProcessing(
            single="<s> $A", pair="<s> $A $B", special_tokens=[("<s>", backend.token_to_id("<s>"))])
        config.update(add_bos_token=True, chat_template=_template("mixtral"))
        _write_json(directory / "special_tokens_map.json", {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"})
        _write_json(directory / "config.json", {"eos_token_id": backend.token_to_id("</s>")})
    backend.save(str(directory / "tokenizer.json"))
    _write_json(directory / "tokenizer_config.json", config)
    return directory


FAMILIES = ["tiny", "qwen3_5", "deepseek_v3", "glm", "mixtral"]


@pytest.fixture(scope="module", params=FAMILIES)
def pair(request, tmp_path_factory) -> tuple[str, Tokenizer, Any]:
    directory = make_model_dir(tmp_path_factory.mktemp("tok"), request.param)
    return request.param, Tokenizer.from_files(directory), AutoTokenizer.from_pretrained(directory)


def test_chat_text_and_ids_match_transformers(pair) -> None:
    family, ours, hf = pair
    rendered = 0
    for name, messages, kwargs in CASES:
        try:
            expected = hf.apply_chat_template(messages, tokenize=False, **{"add_generation_prompt": True, **kwargs})
            expected_ids = hf.apply_chat_template(messages, tokenize=True, return_dict=False,
                                                  **{"add_generation_prompt": True, **kwargs})
        except Exception:
            with pytest.raises(ChatTemplateError):
                ours.apply_chat_template(messages, **kwargs)
            continue
        assert ours.apply_chat_template(messages, **kwargs) == expected, (family, name)
        assert ours.encode_chat(messages, **kwargs) == expected_ids, (family, name)
        rendered += 1
    assert rendered >= 8, family


def test_encode_decode_match_transformers(pair) -> None:
    family, ours, hf = pair
    for text in TEXTS:
        for add in (False, True):
            ids = hf.encode(text, add_special_tokens=add)
            assert ours.encode(text, add_special_tokens=add) == ids, (family, text, add)
            for skip in (False, True):
                assert ours.decode(ids, skip_special_tokens=skip) == hf.decode(ids, skip_special_tokens=skip)


def test_special_tokens_and_sizes_match_transformers(pair) -> None:
    family, ours, hf = pair
    assert ours.special_tokens == hf.special_tokens_map
    assert ours.bos_token_id == hf.bos_token_id and ours.eos_token_id == hf.eos_token_id
    assert ours.vocab_size == len(hf)
    assert ours.add_bos_token == (family in ("deepseek_v3", "mixtral"))
    if ours.add_bos_token:  # the template writes the BOS; encode_chat must not add a second
        ids = ours.encode_chat([{"role": "user", "content": "hi"}])
        assert ids[:1] == [ours.bos_token_id] and ids[1] != ours.bos_token_id


def test_stop_ids(tmp_path: Path) -> None:
    tiny = Tokenizer.from_files(make_model_dir(tmp_path, "tiny"))
    assert tiny.eos_token_ids == {IM_END_ID, IM_END_ID - 2}  # generation_config's list (with the eos token)
    glm = Tokenizer.from_files(make_model_dir(tmp_path, "glm"))
    assert glm.eos_token_ids == {glm.token_to_id(t) for t in ("<|endoftext|>", "<|user|>", "<|observation|>")}
    mixtral = Tokenizer.from_files(make_model_dir(tmp_path, "mixtral"))  # config.json when no generation config
    assert mixtral.eos_token_ids == {mixtral.token_to_id("</s>")}


def test_template_selection(tmp_path: Path) -> None:
    glm = Tokenizer.from_files(make_model_dir(tmp_path, "glm"))
    assert glm.select_chat_template() == _template("glm_5_3_flash")
    assert glm.select_chat_template(tools=[]) == _template("glm_4_5")  # tools given, even empty: tool_use
    assert "<arg_key>city</arg_key>" not in glm.apply_chat_template([{"role": "user", "content": "x"}],
                                                                    tools=[WEATHER_TOOL])
    qwen = Tokenizer.from_files(make_model_dir(tmp_path, "qwen3_5"))
    assert qwen.chat_template == _template("qwen3_5")  # chat_template.jinja beats tokenizer_config.json
    override = Tokenizer.from_files(tmp_path / "qwen3_5", template="{{ messages[0].content }}!")
    assert override.apply_chat_template([{"role": "user", "content": "x"}]) == "x!"


def test_from_mapping_and_from_model(tmp_path: Path) -> None:
    source = make_model_dir(tmp_path, "tiny")
    files = {p.name: p for p in source.iterdir()}
    by_mapping = Tokenizer.from_files(files)
    assert by_mapping.encode_chat([{"role": "user", "content": "hi"}]) == Tokenizer.from_files(source).encode_chat(
        [{"role": "user", "content": "hi"}])

    store = Store(tmp_path / "store")
    layers = [store.add_blob_file(p).descriptor(MEDIA_FILE, {ANNOTATION_TITLE: p.name})
              for p in sorted(source.iterdir()) if p.suffix == ".json"]
    template = store.add_blob_bytes(b"{{ bos_token }}{{ messages[-1].content }}")
    layers.append(template.descriptor(MEDIA_TEMPLATE, {ANNOTATION_TITLE: "template.jinja"}))
    for title, media_type in (("model.ftw.json", MEDIA_FTW_INDEX), ("model-00001.ftw", MEDIA_FTW_SHARD)):
        # (a model's manifest must list an index and a shard to be read; the tokenizer reads neither)
        layers.append(store.add_blob_bytes(title.encode()).descriptor(media_type, {ANNOTATION_TITLE: title}))
    config = store.add_blob_bytes(b"{}").descriptor(MEDIA_CONFIG)
    store.write_manifest("tinytok", Manifest(config=config, layers=layers))
    tokenizer = Tokenizer.from_model(open_model(store, "tinytok"))
    assert tokenizer.apply_chat_template([{"role": "user", "content": "hi"}]) == "<|endoftext|>hi"
    assert "tinytok" in tokenizer.origin


def test_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(TokenizerError, match="has no tokenizer.json"):
        Tokenizer.from_files({"config.json": tmp_path / "config.json"})
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "tokenizer.json").write_text("{not json", encoding="utf-8")
    with pytest.raises(TokenizerError, match="tokenizer.json cannot be loaded"):
        Tokenizer.from_files(bad)
    directory = make_model_dir(tmp_path, "tiny")
    (directory / "generation_config.json").write_text("[1, 2", encoding="utf-8")
    with pytest.raises(TokenizerError, match="generation_config.json is not valid JSON"):
        Tokenizer.from_files(directory)
    (directory / "generation_config.json").write_text('{"eos_token_id": "x"}', encoding="utf-8")
    with pytest.raises(TokenizerError, match="eos_token_id"):
        Tokenizer.from_files(directory)
    (directory / "generation_config.json").unlink()
    config = json.loads((directory / "tokenizer_config.json").read_text(encoding="utf-8"))
    del config["chat_template"]
    _write_json(directory / "tokenizer_config.json", config)
    bare = Tokenizer.from_files(directory)
    assert bare.encode("hi") and bare.decode(bare.encode("hi")) == "hi"  # raw prompts still work
    with pytest.raises(ChatTemplateError, match="has no chat template.*TEMPLATE"):
        bare.encode_chat([{"role": "user", "content": "hi"}])
    config["chat_template"] = [{"name": "a", "template": "x"}, {"name": "b", "template": "y"}]
    _write_json(directory / "tokenizer_config.json", config)
    with pytest.raises(ChatTemplateError, match=r"several chat templates \(a, b\)"):
        Tokenizer.from_files(directory).apply_chat_template([{"role": "user", "content": "hi"}])
    config["chat_template"] = 5
    _write_json(directory / "tokenizer_config.json", config)
    with pytest.raises(TokenizerError, match="chat_template must be"):
        Tokenizer.from_files(directory)
    with pytest.raises(TokenizerError, match="not a directory"):
        Tokenizer.from_files(tmp_path / "missing")


# --- incremental detokenization and stop strings ---------------------------------------------

STREAM_TEXTS = ["héllo wörld 😀👍🏽 中文字符 日本語 한국어 — “quotes” 🇺🇳\n\tend", "🎉" * 5 + "語" * 5, "a 𝕏 b ∑ c"]


def _sentencepiece_style() -> Tokenizer:
    """A Llama/Mixtral-style pipeline: Metaspace, BPE with byte fallback, Strip-the-first-space decoder."""
    from tokenizers import Tokenizer as Backend
    from tokenizers import decoders, models, normalizers

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"<0x{b:02X}>": 3 + b for b in range(256)}}
    for piece in ["▁", "▁h", "h", "e", "l", "o", "▁w", "r", "d", "a", "b", "c", "▁a", "▁b", "▁c"]:
        vocab.setdefault(piece, len(vocab))
    backend = Backend(models.BPE(vocab=vocab, merges=[], unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    backend.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    backend.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                         decoders.Strip(" ", 1, 0)])
    backend.add_special_tokens([AddedToken("<s>", special=True), AddedToken("</s>", special=True)])
    return Tokenizer(backend, special_tokens={"bos_token": "<s>", "eos_token": "</s>"})


def _stream(tokenizer: Tokenizer, ids: list[int], skip: bool) -> list[str]:
    detok = IncrementalDetokenizer(tokenizer, skip_special_tokens=skip)
    pieces = [detok.push(i) for i in ids]
    return pieces + [detok.flush()]


@pytest.fixture(scope="module")
def stream_tokenizers(tmp_path_factory) -> dict[str, Tokenizer]:
    root = tmp_path_factory.mktemp("stream")
    made = {family: Tokenizer.from_files(make_model_dir(root, family)) for family in ("tiny", "deepseek_v3")}
    made["sentencepiece"] = _sentencepiece_style()
    return made


@pytest.mark.parametrize("family", ["tiny", "deepseek_v3", "sentencepiece"])
def test_a_continuation_streams_the_text_it_adds_to_its_context(stream_tokenizers, family: str) -> None:
    """A raw prompt or a prefilled reply goes on from the prompt's last words: the streamed text
    is what decoding prompt + output adds to the prompt's text. Decoded alone, a SentencePiece
    output lost its first space ("hello" + "▁world" came out "helloworld")."""
    tokenizer = stream_tokenizers[family]
    for prompt_text, output_text in (("hello", " world"), ("a b", " c abc"), ("hello", "é héllo")):
        prompt, whole = tokenizer.encode(prompt_text), tokenizer.encode(prompt_text + output_text)
        assert whole[: len(prompt)] == prompt  # the output's ids follow the prompt's
        output = whole[len(prompt):]
        detok = IncrementalDetokenizer(tokenizer, context=prompt[-6:])
        streamed = "".join(detok.push(i) for i in output) + detok.flush()
        assert streamed == tokenizer.decode(whole)[len(tokenizer.decode(prompt)):] == output_text
    if family == "sentencepiece":  # where the context matters: alone, the first space is stripped
        alone = IncrementalDetokenizer(tokenizer)
        assert "".join(alone.push(i) for i in tokenizer.encode("hello world")[len(tokenizer.encode("hello")):]) \
            + alone.flush() == "world"


@pytest.mark.parametrize("family", ["tiny", "deepseek_v3", "sentencepiece"])
def test_incremental_detokenizer_on_text(stream_tokenizers, family: str) -> None:
    tokenizer = stream_tokenizers[family]
    for text in STREAM_TEXTS:
        ids = tokenizer.encode(text)
        assert len(ids) > len(text) // 2  # multi-byte characters really are split over tokens
        for skip in (True, False):
            pieces = _stream(tokenizer, ids, skip)
            assert all(REPLACEMENT_CHAR not in piece for piece in pieces), pieces  # never half a character
            assert "".join(pieces) == tokenizer.decode(ids, skip_special_tokens=skip) == text.lstrip(" ")


@pytest.mark.parametrize("family", ["tiny", "deepseek_v3"])
def test_incremental_detokenizer_on_random_ids(stream_tokenizers, family: str) -> None:
    """Byte-level BPE: any id sequence, invalid UTF-8 included, streams to exactly decode(all)."""
    tokenizer = stream_tokenizers[family]
    rng = random.Random(0)
    specials = sorted(set(tokenizer.eos_token_ids) | {tokenizer.token_to_id("<|im_start|>") or 0})
    for _ in range(300):
        pool = tokenizer.encode(rng.choice(STREAM_TEXTS))  # the byte tokens of emoji and CJK
        ids = [rng.choice(pool) if rng.random() < 0.6 else rng.choice(specials) if rng.random() < 0.2
               else rng.randrange(tokenizer.vocab_size) for _ in range(rng.randrange(1, 40))]
        for skip in (True, False):
            pieces = _stream(tokenizer, ids, skip)
            for piece in pieces:
                piece.encode("utf-8")  # valid text: no lone surrogates
            assert "".join(pieces) == tokenizer.decode(ids, skip_special_tokens=skip)


@pytest.mark.parametrize("family", ["tiny", "deepseek_v3", "sentencepiece"])
def test_incremental_detokenizer_on_random_text_streams(stream_tokenizers, family: str) -> None:
    """Random valid text with special tokens between the pieces: no U+FFFD ever, same text.
    (A byte-fallback decoder turns a run of invalid bytes into U+FFFD as a whole, so for those
    only valid text is promised.)"""
    tokenizer = stream_tokenizers[family]
    rng = random.Random(2)
    words = ["héllo", " wörld", " 😀", "👍🏽", " 中文", "字符", " 日本語", " abc", "\n", " 🇺🇳", "—", "ü"]
    specials = sorted(tokenizer.eos_token_ids)
    for _ in range(200):
        ids: list[int] = []
        for _ in range(rng.randrange(1, 12)):
            ids += tokenizer.encode(rng.choice(words)) if rng.random() < 0.85 else [rng.choice(specials)]
        for skip in (True, False):
            pieces = _stream(tokenizer, ids, skip)
            assert all(REPLACEMENT_CHAR not in piece for piece in pieces), pieces
            assert "".join(pieces) == tokenizer.decode(ids, skip_special_tokens=skip)


def test_incremental_detokenizer_holds_partial_characters(stream_tokenizers) -> None:
    tokenizer = stream_tokenizers["tiny"]
    ids = tokenizer.encode("😀")
    assert len(ids) >= 3  # four UTF-8 bytes over several byte-level tokens
    detok = IncrementalDetokenizer(tokenizer)
    assert [detok.push(i) for i in ids] == [""] * (len(ids) - 1) + ["😀"]
    detok = IncrementalDetokenizer(tokenizer)
    assert [detok.push(i) for i in ids[:2]] == ["", ""]
    assert detok.flush() == REPLACEMENT_CHAR  # generation ended mid-character: decode's own answer


def _reference_stop(text: str, stops: list[str]) -> tuple[str, bool]:
    """Feed one character at a time and stop at the first stop string that completes."""
    for end in range(len(text) + 1):
        found = [(end - len(s)) for s in stops if s and text[:end].endswith(s)]
        if found:
            return text[: min(found)], True
    return text, False


def _feed_all(stops: list[str], chunks: list[str]) -> tuple[str, bool]:
    matcher = StopStringMatcher(stops)
    out = []
    stopped = False
    for chunk in chunks:
        emit, stopped = matcher.feed(chunk)
        assert not any(s and s in emit for s in stops)
        out.append(emit)
        if stopped:
            break
    if not stopped:
        out.append(matcher.flush())
    return "".join(out), stopped


def test_stop_strings_split_across_feeds() -> None:
    matcher = StopStringMatcher(["<|im_end|>"])
    assert matcher.feed("Hello <|") == ("Hello ", False)
    assert matcher.feed("im_") == ("", False)
    assert matcher.feed("end|> more") == ("", True)
    assert matcher.stop == "<|im_end|>" and matcher.feed("x") == ("", True) and matcher.flush() == ""
    matcher = StopStringMatcher(["<|im_end|>"])
    assert matcher.feed("a <|im") == ("a ", False)
    assert matcher.feed("x") == ("<|imx", False)  # could not become the stop string: released
    assert matcher.feed("<") == ("", False) and matcher.flush() == "<"
    matcher = StopStringMatcher(["</s>"])
    assert matcher.feed("end </") == ("end ", False)
    assert matcher.feed("", final=True) == ("</", False)  # the end of generation releases held text


def test_stop_strings_overlapping_prefixes() -> None:
    assert _feed_all(["abcd", "bcx"], list("xabcx")) == ("xa", True)
    assert _feed_all(["abcde", "cd"], list("abcde")) == ("ab", True)  # "cd" completes first
    assert _feed_all(["abcde", "cd"], ["abcde"]) == ("ab", True)  # however the text is split
    assert _feed_all(["aab"], list("aaab")) == ("a", True)
    assert _feed_all(["ab", "b"], ["xab"]) == ("x", True)  # same end: the longer one
    assert _feed_all(["", "zz"], ["no stop here"]) == ("no stop here", False)


def test_stop_strings_random_splits_match_reference() -> None:
    rng = random.Random(1)
    for _ in range(2000):
        text = "".join(rng.choice("abc😀") for _ in range(rng.randrange(0, 14)))
        stops = ["".join(rng.choice("abc😀") for _ in range(rng.randrange(1, 4))) for _ in range(rng.randrange(1, 4))]
        cuts = sorted(rng.sample(range(len(text) + 1), rng.randrange(0, len(text) + 1)))
        chunks = [text[i:j] for i, j in zip([0, *cuts], [*cuts, len(text)], strict=True)]
        assert _feed_all(stops, chunks) == _reference_stop(text, stops), (text, stops, chunks)


def test_the_configs_added_tokens_apply_over_tokenizer_json_as_in_transformers(tmp_path: Path) -> None:
    """Where tokenizer_config.json flags an added token differently from tokenizer.json (rstrip,
    lstrip, special), or names as eos a token tokenizer.json does not mark special, transformers 5
    follows the config: prompt ids and streamed text differed from transformers' before."""
    from transformers import AutoTokenizer

    from ftpull.tiny import build_tiny_tokenizer

    backend = build_tiny_tokenizer()
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "clean_up_tokenization_spaces": False,
              "eos_token": "<think>",
              "added_tokens_decoder": {str(i): {"content": t.content, "lstrip": t.content == "<|im_start|>",
                                                "rstrip": t.content == "<|im_end|>", "normalized": False,
                                                "single_word": False,
                                                "special": t.special or t.content == "<tool_call>"}
                                       for i, t in backend.get_added_tokens_decoder().items()}}
    backend.save(str(tmp_path / "tokenizer.json"))
    _write_json(tmp_path / "tokenizer_config.json", config)
    config["pad_token"] = {"__type": "AddedToken", "content": "<|mypad|>", "rstrip": True, "lstrip": False,
                           "normalized": False, "single_word": False, "special": True}  # in neither file
    _write_json(tmp_path / "tokenizer_config.json", config)
    ours, theirs = Tokenizer.from_files(tmp_path), AutoTokenizer.from_pretrained(tmp_path)
    for text in ("a \n<|im_end|>\n b", "a \n<|im_start|>\n b", "x<tool_call>y<think>z", "a<|mypad|>   b"):
        ids = ours.encode(text)
        assert ids == theirs.encode(text, add_special_tokens=False), text
        assert ours.decode(ids, skip_special_tokens=True) == theirs.decode(ids, skip_special_tokens=True), text


def test_tokens_only_the_config_has_get_their_ids_in_numeric_order(tmp_path: Path) -> None:
    """Sorted as strings, ids 98..101 came in the order 100, 101, 98, 99: two pairs of tokens
    swapped their ids against transformers'."""
    from tokenizers import Tokenizer as Backend
    from tokenizers import models, pre_tokenizers
    from transformers import AutoTokenizer

    backend = Backend(models.WordLevel({chr(ord("0") + i): i for i in range(98)}, unk_token="0"))
    backend.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    backend.save(str(tmp_path / "tokenizer.json"))
    extra = {str(98 + k): {"content": f"<x{k}>", "special": True, "normalized": False, "lstrip": False,
                           "rstrip": False, "single_word": False} for k in range(4)}
    _write_json(tmp_path / "tokenizer_config.json", {"tokenizer_class": "PreTrainedTokenizerFast",
                                                    "added_tokens_decoder": extra})
    ours, theirs = Tokenizer.from_files(tmp_path), AutoTokenizer.from_pretrained(tmp_path)
    text = "1<x0>2<x2><x1>3<x3>"
    assert ours.encode(text) == theirs.encode(text, add_special_tokens=False)
    assert [ours.token_to_id(f"<x{k}>") for k in range(4)] == [98, 99, 100, 101]


def test_only_the_base_vocabulary_must_fit_the_embedding(tmp_path, caplog) -> None:
    """Added tokens past the model's embedding (a tokenizer_config listing more than the model was
    trained with) are logged, not refused: prompts that never use them run; a base vocabulary
    past it is another model's tokenizer."""
    tokenizer = Tokenizer.from_files(build_tiny_checkpoint(tmp_path / "tiny"))
    base = max(tokenizer.backend.get_vocab(with_added_tokens=False).values()) + 1
    assert tokenizer.vocab_size > base  # tiny has added (special) tokens after its base vocabulary
    tokenizer.check_fits(tokenizer.vocab_size)
    tokenizer.check_fits(None)
    with caplog.at_level("WARNING"):
        tokenizer.check_fits(base)
    assert "past the model's" in caplog.text
    with pytest.raises(TokenizerError, match="belong to another model"):
        tokenizer.check_fits(base - 1)
