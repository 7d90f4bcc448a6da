"""`tokenizer.ggml.pre` names -> the pre-tokenizer of the model's original tokenizer, as Hugging Face
`tokenizers` steps (gguf_tokenizer builds the pipeline around them).

llama.cpp (llama-vocab.cpp, llm_tokenizer_bpe, at 0c1e570) maps each name to a list of regexes applied
in turn, each to every piece the previous ones left (matches isolated, the text between them kept as
pieces): exactly a `Sequence` of `Split(..., "Isolated")` steps. Where llama.cpp rewrites the original
tokenizer's regex for its engine (`(?i:'s|...)` as `'[sS]|...`, possessive quantifiers as greedy ones,
o200k's cased classes as lookaheads) the table keeps the original, which llama-vocab.cpp quotes beside
its rewrite: Onig (tokenizers' engine) runs it as the model's own tokenizer did. Where llama.cpp runs a
hand-written splitter instead of a regex (unicode.cpp: kimi-k2's, afmoe's digits) the table has the
regex that splitter stands for; see kimi-k2 below for where they part.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

_QWEN2_SPLIT = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
_LLAMA3_SPLIT = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
# o200k (gpt-oss, Llama 4, MiniMax-M2): cased words with their contraction, digits in threes
_GPT4O_SPLIT = (
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"""
    r"""|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"""
    r"""|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
# Mistral's tekken (Mistral NeMo, Mistral Small 3.x and 4), its tokenizer.json's regex as llama-vocab.cpp quotes
# it: o200k's cased words without the contractions, and every digit alone
_TEKKEN_SPLIT = (
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"""
    r"""|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"""
    r"""|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
_DEEPSEEK_V3_SPLITS = (
    r"\p{N}{1,3}",
    "[一-龥\u3040-ゟ゠-ヿ]+",
    r"""[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""",
)

# K-EXAONE's (tokenizer.json's original, which llama-vocab.cpp quotes): letters joined across single spaces
_EXAONE_MOE_SPLIT = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?(?:\p{L}\p{M}*(?: \p{L}\p{M}*)*)+|\p{N}"""
    r"""| ?[^\s\p{L}\p{N}]+[\r\n/]?|\s*[\r\n]|\s+(?!\S)|\s+"""
)

# Arcee Trinity's (AFMoE), as llama-vocab.cpp has it: digit runs in threes from the right (its
# \p{AFMoE_digits}, unicode.cpp's custom split), runs of CJK and other Asian scripts (its ranges, verbatim),
# then DeepSeek-V3's word regex
_AFMOE_SPLITS = (
    r"\p{N}{1,3}(?=(?:\p{N}{3})*(?!\p{N}))",
    "[\u4e00-\u9fff\u3400-\u4dbf\u8c48-\ufaff\u3040-\u309f\u30a0-\u30ff\uff65-\uff9f\u2f00-\u2fdf\u0e40-\u0e7f"
    "\u0e80-\u0eff\u1780-\u17ff\u1000-\u109f\uaa60-\uaa7f\ua9e0-\ua9ff\uac00-\ud7af\u1100-\u11ff]+",
    _DEEPSEEK_V3_SPLITS[2],
)



# GPT-2's own regex (ByteLevel's use_regex), as llama-vocab.cpp's GPT2 case has it, with the trailing `|\s+`
# ByteLevel adds (llama.cpp keeps what no alternative matches as a piece: the same pieces)
_GPT2_SPLIT = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
# Qwen3.5's tokenizer.json (llama-vocab.cpp's QWEN35 quotes it): Qwen2's with marks kept on their letters
_QWEN35_SPLIT = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
# Ling 2.0's tokenizer.json (llama-vocab.cpp's BAILINGMOE quotes it; its rewrite makes the possessive
# quantifiers greedy, which matches the same: what they stop backtracking over cannot start a match)
_BAILINGMOE_SPLIT = (
    r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]++[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+"""
)
# Kimi K2's tiktoken pat_str (tokenization_kimi.py; unicode.cpp quotes it over its hand-written splitter):
# runs of Han apart, o200k's cased words with Han taken out of the letter classes (Onig's `&&`, as
# tiktoken's fancy-regex reads it), digits in threes, and no `/` on the punctuation
_KIMI_K2_SPLIT = (
    r"""[\p{Han}]+"""
    r"""|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+"""
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)?"""
    r"""|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*"""
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)?"""
    r"""|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
# DeepSeek LLM's and DeepSeek-V2's (llama-vocab.cpp's DEEPSEEK_LLM, verbatim: its tokenizer.json's Splits): line
# ends alone, words of Latin, Greek, Cyrillic... letters with one space before, ASCII and full-width
# punctuation likewise, trailing spaces, CJK and Hangul runs, then digit runs
_DEEPSEEK_CJK = "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+"
_DEEPSEEK_LLM_SPLITS = (
    "[\r\n]",
    r"\s?["
    "A-Za-z\u00b5\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u01ba\u01bc-\u01bf\u01c4-\u0293\u0295-\u02af"
    "\u0370-\u0373\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c\u038e-\u03a1\u03a3-\u03f5"
    "\u03f7-\u0481\u048a-\u052f\u0531-\u0556\u10a0-\u10c5\u13a0-\u13f5\u13f8-\u13fd\u1c90-\u1cba"
    "\u1cbd-\u1cbf\u1d00-\u1d2b\u1d6b-\u1d77\u1d79-\u1d9a\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45"
    "\u1f48-\u1f4d\u1f50-\u1f57\u1f59\u1f5b\u1f5d\u1f5f-\u1f7d\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe"
    "\u1fc2-\u1fc4\u1fc6-\u1fcc\u1fd0-\u1fd3\u1fd6-\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4\u1ff6-\u1ffc"
    "\u2102\u2107\u210a-\u2113\u2115\u2119-\u211d\u2124\u2126\u2128\u212a-\u212d\u212f-\u2134\u2139"
    "\u213c-\u213f\u2145-\u2149\u214e\u2183\u2184\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee\u2cf2\u2cf3"
    "\ua640-\ua66d\ua680-\ua69b\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e\uab70-\uabbf\ufb00-\ufb06"
    "\ufb13-\ufb17\uff21-\uff3a\uff41-\uff5a\U00010400-\U0001044f\U000104b0-\U000104d3"
    "\U000104d8-\U000104fb\U00010c80-\U00010cb2\U00010cc0-\U00010cf2\U000118a0-\U000118df"
    "\U0001e900-\U0001e943"
    "]+",
    "\\s?[!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002]+",
    r"\s+$",
    _DEEPSEEK_CJK,
    r"\p{N}+",
)
# DeepSeek Coder's (llama-vocab.cpp's DEEPSEEK_CODER): the same without the letter and punctuation lists,
# every digit alone
_DEEPSEEK_CODER_SPLITS = ("[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", _DEEPSEEK_CJK, r"\p{N}")

@dataclass(frozen=True)
class PreTokenizer:
    splits: tuple[str, ...]  # regexes applied in turn, matches isolated; () = GPT-2's built-in regex
    normalizer: str | None = None  # e.g. "NFC"
    # False: SentencePiece-style BPE in a 'gpt2' file (llama-vocab.cpp's byte_encode false with
    # escape_whitespaces): spaces become U+2581 first, merges run over raw UTF-8, a character without
    # a token falls back to its <0xXX> byte tokens
    byte_level: bool = True
    # True: a piece that is itself a token is that token, before any merge (tiktoken's encoder does this;
    # a converted tiktoken vocabulary can hold tokens no merge builds)
    ignore_merges: bool = False


PRE_TOKENIZERS: dict[str, PreTokenizer] = {
    "qwen2": PreTokenizer((_QWEN2_SPLIT,), "NFC"),  # Qwen2, Qwen2.5, Qwen3 (their tokenizer.json normalizes NFC)
    "llama-bpe": PreTokenizer((_LLAMA3_SPLIT,), ignore_merges=True),  # Llama 3 (its tokenizer.json ignores merges too)
    "deepseek-v3": PreTokenizer(_DEEPSEEK_V3_SPLITS),  # DeepSeek-V3 / R1
    "hy_v4": PreTokenizer(_DEEPSEEK_V3_SPLITS),  # Tencent Hy4 (llama-vocab.cpp's HY_V4: DeepSeek-V3's regexes)
    "gpt-2": PreTokenizer(()),  # GPT-2's ByteLevel regex
    "gpt-4o": PreTokenizer((_GPT4O_SPLIT,)),  # gpt-oss (o200k_harmony), Llama 4
    "tekken": PreTokenizer((_TEKKEN_SPLIT,), ignore_merges=True),  # Mistral's tekken (Mistral Small 4)
    "exaone-moe": PreTokenizer((_EXAONE_MOE_SPLIT,)),  # K-EXAONE
    "afmoe": PreTokenizer(_AFMOE_SPLITS),  # Arcee Trinity
    "sarvam-moe": PreTokenizer((r"[^\n]+|[\n]+",), byte_level=False),  # Sarvam-30B: lines and runs of newlines
    "gemma4": PreTokenizer((r"[^\n]+|[\n]+",), byte_level=False),  # Gemma 4 (tokenizer model "gemma4"): the same
}
# Names llama-vocab.cpp (llama.cpp 0c1e570, llm_tokenizer_bpe) gives the same regex as one above:
# LLAMA3's for llama3/llama-v3 and LFM2's lfm2, for DBRX and Smaug ("same as llama3") and for CHATGLM4
# (GLM-4.5 to GLM-5's glm4/glm5, chatglm-bpe: the identical pattern); GPT2's for OLMO (OLMoE); GPT4O's (the
# tokenizer.json original its comment quotes) for llama4 and minimax-m2. It takes a piece that is a token
# whole (ignore_merges) for llama3/llama-v3/llama-bpe/lfm2, glm4/glm5 and tekken, not for dbrx, smaug-bpe,
# chatglm-bpe or GPT4O's names.
PRE_TOKENIZERS |= {name: PRE_TOKENIZERS["llama-bpe"] for name in ("llama3", "llama-v3", "glm4", "glm5", "lfm2")}
PRE_TOKENIZERS |= {name: replace(PRE_TOKENIZERS["llama-bpe"], ignore_merges=False)
                   for name in ("dbrx", "smaug-bpe", "chatglm-bpe")}
PRE_TOKENIZERS |= {"olmo": PRE_TOKENIZERS["gpt-2"]}
PRE_TOKENIZERS |= {name: PRE_TOKENIZERS["gpt-4o"] for name in ("llama4", "minimax-m2")}
# Added for the MoE families whose GGUFs name these (llama.cpp 0c1e570's convert_hf_to_gguf.py writes them):
PRE_TOKENIZERS |= {
    # Hunyuan-A13B (hunyuan-moe): its tiktoken tokenizer (tokenization_hy.py) normalizes NFC and splits with
    # Qwen's regex, which llama-vocab.cpp runs (QWEN2's). Both tiktoken models take a piece that is a token
    # whole, as tiktoken does (llama.cpp merges it; the same wherever the converter's merges build the token)
    "hunyuan": PreTokenizer((_QWEN2_SPLIT,), "NFC", ignore_merges=True),
    # Qwen3.5 (qwen35moe): its tokenizer.json's regex, NFC as Qwen's tokenizers
    "qwen35": PreTokenizer((_QWEN35_SPLIT,), "NFC"),
    # Solar Open (written as glm4moe): llama-vocab.cpp gives it QWEN2's regex; no normalizer there
    "solar-open": PreTokenizer((_QWEN2_SPLIT,)),
    # Granite 3.x MoE (granitemoe) and StarCoder's vocabulary: every digit alone, then GPT-2's regex (their
    # tokenizer.json: Digits(individual_digits) then ByteLevel(use_regex)); llama-vocab.cpp's REFACT/STARCODER
    "refact": PreTokenizer((r"\p{N}", _GPT2_SPLIT)),
    "starcoder": PreTokenizer((r"\p{N}", _GPT2_SPLIT)),
    # Mellum 2 (mellum): llama-vocab.cpp's MELLUM2 runs STARCODER's regexes
    "mellum2": PreTokenizer((r"\p{N}", _GPT2_SPLIT)),
    # Cohere's North Mini Code (cohere2moe) and Tiny Aya: llama-vocab.cpp's TINY_AYA, its tokenizer.json's
    # digits in threes from the right, then o200k's regex (GPT4O's original)
    "cohere2moe": PreTokenizer((r"\d{1,3}(?=(?:\d{3})*\b)", _GPT4O_SPLIT)),
    # Poolside Laguna (laguna): llama-vocab.cpp's LAGUNA, lines and runs of newlines apart, then words,
    # every digit alone
    "laguna": PreTokenizer((r"[^\n]+|[\n]+", r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
                            r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")),
    # DeepSeek-V2 / V2-Lite (deepseek2) and DeepSeek LLM
    "deepseek-llm": PreTokenizer(_DEEPSEEK_LLM_SPLITS),
    "deepseek-coder": PreTokenizer(_DEEPSEEK_CODER_SPLITS),
    # Ling 2.0 (bailingmoe2, the architecture Sarvam's files share)
    "bailingmoe2": PreTokenizer((_BAILINGMOE_SPLIT,)),
    "bailingmoe": PreTokenizer((_BAILINGMOE_SPLIT,)),
    # Kimi K2 / K2.5 (deepseek2). llama.cpp runs a hand-written splitter for it (unicode.cpp,
    # unicode_regex_split_custom_kimi_k2) that parts from the regex it quotes in three ways: a word is any run
    # of letters (the regex cuts "camelCase" before the capital), combining marks (\p{M}) are not letters,
    # and "Han" is nine fixed CJK blocks (not 々, 〇, the CJK radicals or Extension G and later). Kimi's own
    # tokenizer runs the regex, which is what the model was trained on; ft follows it.
    "kimi-k2": PreTokenizer((_KIMI_K2_SPLIT,), ignore_merges=True),
}
