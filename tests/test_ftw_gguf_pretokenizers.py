"""GGUF pre-tokenizer names added for the MoE families' published files (issue 21): hunyuan (Hunyuan-A13B),
kimi-k2 (Kimi K2), refact/starcoder (Granite 3.x MoE), deepseek-llm/deepseek-coder (DeepSeek-V2), qwen35
(Qwen3.5 MoE), solar-open, bailingmoe2 (Ling 2.0).

Each vocabulary is written as llama.cpp's convert_hf_to_gguf.py writes it, and the rebuilt tokenizer's ids
are checked against the model's own tokenizer: a `tokenizers` Tokenizer with its tokenizer.json's
pre-tokenizer, or for the tiktoken models (Hunyuan, Kimi) a plain-Python tiktoken (rank BPE, direct lookup
of whole pieces) with their pat_str. The vocabulary is trained without any pre-tokenizer, so its merges
cross every boundary a regex draws: a piece cut in the wrong place gives other ids. The splits are also
compared with llama.cpp's own regexes (llama-vocab.cpp, as it writes them) run the way llama.cpp runs them,
each over every piece the previous left, with Python's `regex`.
"""

from __future__ import annotations

import json
import re
import tarfile
import unicodedata
from pathlib import Path

import pytest
import regex
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

from ftw.gguf_pretokenizers import PRE_TOKENIZERS
from ftw.gguf_tokenizer import gguf_tokenizer_json
from tests.gguf_vocab import CONTROL, NORMAL, UNUSED, export_byte_level, write_tokenizer_gguf
from tests.test_ftw_gguf_tokenizer import TEXTS, assert_same_ids, plain, rebuilt

LCPP_TARBALL = Path(__file__).resolve().parents[1] / ".lcpp" / "llama.cpp-0c1e570-src.tar.xz"

# text that tells the regexes apart: camel case, contractions (and the long s (?i:) folds to s), digit
# runs, CJK and kana and Hangul runs next to Latin, marks, runs of spaces before words and at line ends,
# punctuation with and without a space, line ends alone and in runs, full-width punctuation
PRE_TEXTS = [
    "HelloWorld's parseJSONValue HTTPServer I'M they'RE x'ſ don't",
    "Price 1234567 and 12,5 or 3.14159; ٣٤٥ ² ½",
    "东京タワーは高い 한국어 텍스트 abc日本def 々〇 ⺀ 𠀀",
    "naïve café Ελληνικά Кириллица e\u0301te\u0301 q\u0301x हिन्दी ﬁne",
    "def f(x):\n    return x  # two spaces  \n\n\n\tend\r\n  \r\n",
    "a/b//c --> ==> !!! ... ?!\n\nNEXT  trailing   ",
    "全角！（括弧）「引用」、。‘quote’ “double” 　x",
]
CORPUS = (PRE_TEXTS * 3) + TEXTS + [
    "HelloWorld HelloWorld helloWorld hello world Hello World",
    "1234567890 123 456 789 12345 2025 2026 1000000",
    "东京 东京タワー 日本語 日本 한국어 한국",
    "it's It's IT'S we'll We'LL they're you've I'm he'd",
    "    indented\n        more\n\n\n  \n\t\tx",
]


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte spelling: printable bytes as themselves, the rest from U+0100 on."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    rest = [b for b in range(256) if b not in keep]
    return {b: chr(b) for b in keep} | {b: chr(256 + n) for n, b in enumerate(rest)}


def trained_bpe() -> Tokenizer:
    """A byte-level BPE trained with no split at all, so merges join across spaces, digits and scripts."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    trainer = trainers.BpeTrainer(vocab_size=900, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS, trainer=trainer)
    return tok


@pytest.fixture(scope="module")
def bpe() -> dict:
    return json.loads(trained_bpe().to_str())["model"]


def hf_reference(bpe: dict, pre_tokenizer: pre_tokenizers.PreTokenizer, *, nfc: bool = False,
                 specials: tuple[str, ...] = ("<|endoftext|>",)) -> Tokenizer:
    """`bpe`'s vocabulary and merges behind the model's own pre-tokenizer, as its tokenizer.json has it."""
    tok = Tokenizer(models.BPE(vocab=bpe["vocab"], merges=[tuple(m) for m in bpe["merges"]]))
    tok.pre_tokenizer = pre_tokenizer
    tok.decoder = decoders.ByteLevel()
    if nfc:
        tok.normalizer = normalizers.NFC()
    tok.add_special_tokens(list(specials))
    return tok


def byte_level_then(*splits: str) -> pre_tokenizers.Sequence:
    return pre_tokenizers.Sequence([*(pre_tokenizers.Split(Regex(r), "isolated") for r in splits),
                                    pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])


def gguf_from(reference: Tokenizer, path: Path, pre: str) -> Tokenizer:
    """`reference` written as convert_hf_to_gguf's get_vocab_base does (8 padding ids past it), rebuilt."""
    tokens, types, merges = export_byte_level(reference, reference.get_vocab_size(with_added_tokens=True) + 8)
    write_tokenizer_gguf(path, tokens, types, pre=pre, merges=merges,
                         ids={"eos_token_id": reference.token_to_id("<|endoftext|>")})
    return rebuilt(path)


# -- llama.cpp's regexes, run as llama.cpp runs them -------------------------------------------------------

# llama-vocab.cpp (0c1e570), llm_tokenizer_bpe, as it writes them (its rewrites of the originals)
_LCPP_QWEN2 = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
               r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_LCPP_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
LLAMA_CPP = {
    "hunyuan": (_LCPP_QWEN2,),
    "solar-open": (_LCPP_QWEN2,),
    "qwen35": (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
               r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",),
    "refact": (r"\p{N}", _LCPP_GPT2),
    "starcoder": (r"\p{N}", _LCPP_GPT2),
    "bailingmoe2": (r"'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+",),
    "deepseek-coder": ("[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", "[一-龥ࠀ-一가-퟿]+", r"\p{N}"),
}
_LCPP_CASE = {"hunyuan": "HUNYUAN", "solar-open": "SOLAR_OPEN", "qwen35": "QWEN35", "refact": "REFACT",
              "starcoder": "STARCODER", "bailingmoe2": "BAILINGMOE", "deepseek-coder": "DEEPSEEK_CODER",
              "deepseek-llm": "DEEPSEEK_LLM"}


def llama_cpp_split(text: str, regexes: tuple[str, ...]) -> list[str]:
    pieces = [text]
    for expr in regexes:
        out = []
        for piece in pieces:
            at = 0
            for m in regex.finditer(expr, piece):
                out += [piece[at : m.start()]] if m.start() > at else []
                out += [m.group()] if m.group() else []
                at = m.end()
            out += [piece[at:]] if at < len(piece) else []
        pieces = out
    return pieces


def our_split(pre: str, text: str) -> list[str]:
    """Our pre-tokenizer's pieces for `text`, as text (its byte-level spelling undone)."""
    meta = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": pre, "tokenizer.ggml.tokens": ["a", "b"],
            "tokenizer.ggml.token_type": [NORMAL, NORMAL], "tokenizer.ggml.merges": []}
    tok = Tokenizer.from_str(json.dumps(gguf_tokenizer_json(meta)))
    decoder = {c: b for b, c in bytes_to_unicode().items()}
    return [bytes(decoder[c] for c in piece).decode() for piece, _ in tok.pre_tokenizer.pre_tokenize_str(text)]


@pytest.mark.parametrize("pre", sorted(LLAMA_CPP))
def test_splits_as_llama_cpp_s_regexes(pre: str) -> None:
    """Where llama.cpp rewrites the original regex (`'[sS]` for `(?i:'s)`, greedy for possessive) the
    pieces are the same (x'ſ: the long s folds to s, but the letter alternative takes it there anyway)."""
    for text in PRE_TEXTS + TEXTS:
        assert our_split(pre, text) == llama_cpp_split(text, LLAMA_CPP[pre]), (pre, text)


def test_deepseek_llm_splits() -> None:
    """DeepSeek-V2's (deepseek-llm): line ends alone, Latin/Greek/Cyrillic words with one space before,
    ASCII and full-width punctuation runs likewise, trailing spaces at a piece's end, runs of CJK (its
    U+0800-U+4E00 range takes kana and CJK brackets too) and Hangul, digit runs whole; what no regex
    takes (spaces before CJK, a combining mark) stays a piece of its own."""
    got = our_split("deepseek-llm", "Hello, world!! 12345 東京タワー 한국어\r\nΕλληνικά  x  「引用」 e\u0301")
    assert got == ["Hello", ",", " world", "!!", " ", "12345", " ", "東京タワー", " ", "한국어", "\r", "\n",
                   "Ελληνικά", " ", " x", "  ", "「引用」", " e", "\u0301"]
    assert our_split("deepseek-llm", "end   ") == ["end", "   "]


@pytest.mark.skipif(not LCPP_TARBALL.exists(), reason="llama.cpp source tarball absent")
def test_regexes_are_llama_cpp_s_verbatim() -> None:
    """The test's copies above, and ft's own regexes where ft runs llama.cpp's (DeepSeek's lists, the
    digits before GPT-2's regex), are the strings of llama-vocab.cpp at 0c1e570."""
    with tarfile.open(LCPP_TARBALL) as tar:
        member = tar.extractfile("llama.cpp/src/llama-vocab.cpp")
        assert member is not None
        src = member.read().decode()
    src = src[src.index("struct llm_tokenizer_bpe : llm_tokenizer") :]

    def exprs(case: str) -> tuple[str, ...]:
        body = src[src.index(f"case LLAMA_VOCAB_PRE_TYPE_{case}:") :]
        body = body[: body.index("break;")]
        body = "\n".join(line for line in body.splitlines() if not line.strip().startswith("//"))
        return tuple(bytes(s, "utf-8").decode("unicode_escape").encode("latin-1").decode()
                     for s in re.findall(r'"((?:[^"\\]|\\.)*)"', body))

    for pre, case in _LCPP_CASE.items():
        theirs = exprs(case)
        if pre in LLAMA_CPP:
            assert LLAMA_CPP[pre] == theirs, pre
        if pre in ("deepseek-llm", "deepseek-coder"):
            assert PRE_TOKENIZERS[pre].splits == theirs, pre
        if pre in ("refact", "starcoder"):
            assert PRE_TOKENIZERS[pre].splits == (theirs[0], theirs[1] + r"|\s+"), pre
    # (the kimi-k2 case is the trigger unicode.cpp's hand-written splitter answers to)
    assert exprs("KIMI_K2") == (r"\p{Han}+",)


# -- ids against the models' own tokenizers -------------------------------------------------------------

# Granite 3.x's (and StarCoder's) tokenizer.json: Digits(individual_digits) then ByteLevel with its regex
GRANITE = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                   pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
# Qwen3.5's tokenizer.json and Ling 2.0's, as llama-vocab.cpp quotes them
QWEN35 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"
          r"|\s*[\r\n]+|\s+(?!\S)|\s+")
LING = r"'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]++[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+"


@pytest.mark.parametrize(("pre", "reference", "nfc"), [
    ("refact", GRANITE, False),
    ("starcoder", GRANITE, False),
    ("qwen35", byte_level_then(QWEN35), True),
    ("bailingmoe2", byte_level_then(LING), False),
    ("solar-open", byte_level_then(_LCPP_QWEN2), False),
    ("deepseek-coder", byte_level_then(*LLAMA_CPP["deepseek-coder"]), False),
])
def test_ids_match_the_model_s_tokenizer(bpe: dict, tmp_path: Path, pre: str, reference: pre_tokenizers.PreTokenizer,
                                         nfc: bool) -> None:
    original = hf_reference(bpe, reference, nfc=nfc)
    ours = gguf_from(original, tmp_path / f"{pre}.gguf", pre)
    for text in PRE_TEXTS + TEXTS:
        assert plain(ours, text) == original.encode(text).ids, (pre, text)
        if not nfc or unicodedata.is_normalized("NFC", text):
            assert ours.decode(plain(ours, text), skip_special_tokens=False) == text
    assert plain(ours, "12345<|endoftext|>") == original.encode("12345<|endoftext|>").ids


def test_deepseek_llm_ids(bpe: dict, tmp_path: Path) -> None:
    """DeepSeek-V2's tokenizer.json Splits (llama.cpp's copy, checked verbatim above)."""
    original = hf_reference(bpe, byte_level_then(*PRE_TOKENIZERS["deepseek-llm"].splits))
    ours = gguf_from(original, tmp_path / "dsv2.gguf", "deepseek-llm")
    assert_same_ids(ours, original, PRE_TEXTS + TEXTS)


def test_refact_splits_digits_where_gpt_2_does_not(tmp_path: Path) -> None:
    assert our_split("refact", "in 2025, x1 'twas") == ["in", " ", "2", "0", "2", "5", ",", " x", "1", " '", "twas"]
    assert our_split("gpt-2", "in 2025, x1") == ["in", " 2025", ",", " x", "1"]


# -- the tiktoken models: Hunyuan-A13B and Kimi K2 ----------------------------------------------------

HUNYUAN_PAT = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
               r"""|\s*[\r\n]+|\s+(?!\S)|\s+""")  # tokenization_hy.py's PAT_STR
KIMI_PAT = "|".join([  # tokenization_kimi.py's pat_str
    r"""[\p{Han}]+""",
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""\p{N}{1,3}""",
    r""" ?[^\s\p{L}\p{N}]+[\r\n]*""",
    r"""\s*[\r\n]+""",
    r"""\s+(?!\S)""",
    r"""\s+""",
])


def bpe_parts(ranks: dict[bytes, int], token: bytes, max_rank: int | None = None) -> list[bytes]:
    """convert_hf_to_gguf's QwenModel.bpe: merge the lowest-ranked pair until none ranks below max_rank."""
    parts = [bytes([b]) for b in token]
    while True:
        pairs = [(ranks[a + b], i) for i, (a, b) in enumerate(zip(parts, parts[1:], strict=False)) if a + b in ranks]
        if not pairs or (max_rank is not None and min(pairs)[0] >= max_rank):
            return parts
        i = min(pairs)[1]
        parts[i : i + 2] = [parts[i] + parts[i + 1]]


class TikToken:
    """tiktoken's Encoding in plain Python: special tokens cut out, the pattern's matches, a match that is
    itself a token taken whole, else rank BPE."""

    def __init__(self, pat: str, ranks: dict[bytes, int], specials: dict[str, int], *, nfc: bool) -> None:
        self.pat, self.ranks, self.specials, self.nfc = regex.compile(pat, regex.V1), ranks, specials, nfc

    def encode(self, text: str) -> list[int]:
        if self.nfc:  # tokenization_hy.py normalizes the whole text first
            text = unicodedata.normalize("NFC", text)
        out: list[int] = []
        for n, chunk in enumerate(regex.split("(" + "|".join(map(regex.escape, self.specials)) + ")", text)):
            if n % 2:
                out.append(self.specials[chunk])
                continue
            for m in self.pat.finditer(chunk):
                piece = m.group().encode()
                out += [self.ranks[piece]] if piece in self.ranks else [self.ranks[p] for p in bpe_parts(self.ranks, piece)]
        return out


def tiktoken_gguf(bpe: dict, path: Path, pre: str, pat: str, *, nfc: bool) -> tuple[TikToken, Tokenizer, list[str]]:
    """A tiktoken vocabulary (ranks: the 256 bytes, then the trained merges in order; special tokens after
    a gap), written as HunYuanMoEModel.set_vocab / DeepseekV2Model.set_vocab write it: tokens by rank in
    GPT-2's byte spelling, [PAD] in the gap, specials CONTROL, merges rebuilt from the ranks."""

    encoder = bytes_to_unicode()
    decoder = {c: b for b, c in encoder.items()}
    ranks = {bytes([b]): b for b in range(256)}
    for left, right in bpe["merges"]:
        ranks.setdefault(bytes(decoder[c] for c in left + right), len(ranks))
    # a token no merge builds (its bytes have no ranked pairs): tiktoken takes it whole where a piece is it,
    # merges alone never reach it (the converter writes no merge for it, its parts being more than two)
    ranks[b" zzqq"] = len(ranks)
    specials = {"<|startoftext|>": len(ranks) + 3, "<|endoftext|>": len(ranks) + 4}
    spell = {rank: "".join(encoder[b] for b in token) for token, rank in ranks.items()}
    merges = []
    for token, rank in ranks.items():
        parts = bpe_parts(ranks, token, max_rank=rank) if len(token) > 1 else []
        if len(parts) == 2:
            merges.append(" ".join("".join(encoder[b] for b in p) for p in parts))
    reverse = spell | {i: t for t, i in specials.items()}
    size = max(reverse) + 1
    tokens = [reverse.get(i, f"[PAD{i}]") for i in range(size)]
    types = [UNUSED if i not in reverse else CONTROL if i in specials.values() else NORMAL for i in range(size)]
    write_tokenizer_gguf(path, tokens, types, pre=pre, merges=merges,
                         ids={"bos_token_id": specials["<|startoftext|>"], "eos_token_id": specials["<|endoftext|>"]})
    return TikToken(pat, ranks, specials, nfc=nfc), rebuilt(path), tokens


@pytest.mark.parametrize(("pre", "pat", "nfc"), [("hunyuan", HUNYUAN_PAT, True), ("kimi-k2", KIMI_PAT, False)])
def test_tiktoken_models_match_tiktoken(bpe: dict, tmp_path: Path, pre: str, pat: str, nfc: bool) -> None:
    reference, ours, tokens = tiktoken_gguf(bpe, tmp_path / f"{pre}.gguf", pre, pat, nfc=nfc)
    texts = [*PRE_TEXTS, *TEXTS, "<|startoftext|>HelloWorld<|endoftext|>", "cafe\u0301 e\u0301te\u0301", "a zzqq zzqqb"]
    for text in texts:
        got = plain(ours, text)
        assert got == reference.encode(text), (pre, text)
        if not nfc:
            assert ours.decode(got, skip_special_tokens=False) == text
    assert [ours.id_to_token(i) for i in range(len(tokens))] == tokens
    assert plain(ours, " zzqq") == [tokens.index("Ġzzqq")]
    if nfc:  # a decomposed é is composed first, as tokenization_hy.py does
        assert plain(ours, "cafe\u0301") == plain(ours, "café")


def llama_cpp_kimi_k2_split(text: str) -> list[str]:
    """unicode.cpp's unicode_regex_split_custom_kimi_k2 (0c1e570), in plain Python."""
    def han(c: str | None) -> bool:
        o = ord(c) if c else -1
        return any(lo <= o <= hi for lo, hi in ((0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF),
                                                (0x2A700, 0x2B73F), (0x2B740, 0x2B81F), (0x2B820, 0x2CEAF),
                                                (0x2CEB0, 0x2EBEF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F)))

    def at(i: int) -> str | None:
        return text[i] if 0 <= i < len(text) else None

    def letter(c: str | None) -> bool:
        return c is not None and unicodedata.category(c).startswith("L")

    def number(c: str | None) -> bool:
        return c is not None and unicodedata.category(c).startswith("N")

    def space(c: str | None) -> bool:
        return c is not None and c.isspace()

    out, prev, pos = [], 0, 0

    def cut(end: int) -> None:
        nonlocal prev
        if end > prev:
            out.append(text[prev:end])
        prev = end

    while pos < len(text):
        c = at(pos)
        if han(c):
            while han(at(pos)):
                pos += 1
            cut(pos)
            continue
        lead = not (c in "\r\n" or letter(c) or number(c))
        if (letter(c) and not han(c)) or (lead and letter(at(pos + 1)) and not han(at(pos + 1))):
            pos += lead
            while letter(at(pos)) and not han(at(pos)):
                pos += 1
            if at(pos) == "'" and pos + 1 < len(text):
                nxt = text[pos + 1].lower()
                if nxt in "stmd":
                    pos += 2
                elif pos + 2 < len(text) and nxt + text[pos + 2].lower() in ("re", "ve", "ll"):
                    pos += 3
            cut(pos)
            continue
        if number(c):
            start = pos
            while number(at(pos)):
                pos += 1
                if pos - start >= 3:
                    cut(pos)
                    start = pos
            cut(pos)
            continue
        c2 = at(pos + 1) if c == " " else c
        if c2 is not None and not (space(c2) or letter(c2) or number(c2)):
            pos += c == " "
            while at(pos) is not None and not (space(at(pos)) or letter(at(pos)) or number(at(pos))):
                pos += 1
            while at(pos) in ("\r", "\n"):
                pos += 1
            cut(pos)
            continue
        n, last_nl = 0, 0
        while space(at(pos + n)):
            if at(pos + n) in "\r\n":
                last_nl = pos + n + 1
            n += 1
        if last_nl:
            pos = last_nl
        elif n > 1 and at(pos + n) is not None:
            pos += n - 1
        else:
            pos += max(n, 1)
        cut(pos)
    return out


def test_kimi_k2_splits_as_llama_cpp_where_its_splitter_follows_the_regex() -> None:
    """llama.cpp's hand-written kimi-k2 splitter and Kimi's regex (ft's) agree on lower-case and
    capitalized words, contractions, Han runs between Latin, digits in threes, punctuation and spaces..."""
    agree = ["Hello world's 東京タワーは1234567円 abc日本def ok?!\n\nNEXT  x", "I'M they'RE don't\tgo\r\n  \r\n",
             "a/b//c --> ==> !!! ... 全角！（括弧）", "Price 12,5 or 3.14159 한국어 Ελληνικά", "  trailing   "]
    for text in agree:
        assert our_split("kimi-k2", text) == llama_cpp_kimi_k2_split(text), text
    # ...and part where the splitter does not follow it: camel case (the regex cuts before the capital),
    # combining marks (letters' in the regex) and Han outside llama.cpp's nine blocks (々〇)
    assert our_split("kimi-k2", "parseJSONValue") == ["parse", "JSONValue"]
    assert llama_cpp_kimi_k2_split("parseJSONValue") == ["parseJSONValue"]
    assert our_split("kimi-k2", "e\u0301te\u0301") == ["e\u0301te\u0301"]
    assert llama_cpp_kimi_k2_split("e\u0301te\u0301") != ["e\u0301te\u0301"]
    assert our_split("kimi-k2", "日々") == ["日々"] and llama_cpp_kimi_k2_split("日々") == ["日", "々"]
