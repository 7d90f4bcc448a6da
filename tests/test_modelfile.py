"""Modelfile parsing: shipped recipes, inheritance, every error with its line, garbage input."""

from __future__ import annotations

import random
import re
from pathlib import Path

import pytest

from ftpull.modelfile import (
    DTYPES,
    MAX_MODELFILE_BYTES,
    ModelfileError,
    Source,
    UnknownTagError,
    builtin_modelfiles,
    load_builtin_modelfile,
    load_modelfile,
    parse_modelfile,
    parse_source,
)

SHIPPED = builtin_modelfiles()
HF_REPO = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*")


def parse(text: str, **kwargs) -> object:
    kwargs.setdefault("name", "m")
    kwargs.setdefault("path", "Modelfiles/x.Modelfile")
    return parse_modelfile(text, **kwargs)


def error_of(text: str, **kwargs) -> ModelfileError:
    with pytest.raises(ModelfileError) as info:
        parse(text, **kwargs)
    return info.value


# --- shipped recipes ------------------------------------------------------------------------------

def test_ships_the_required_recipes_and_twenty_plus_models():
    assert len(SHIPPED) >= 21  # 20+ real models plus tiny
    for name in ("qwen3.6-35b", "glm-5.2", "deepseek-v4-flash", "qwen3-30b-a3b", "mixtral-8x7b", "deepseek-v3", "tiny"):
        assert name in SHIPPED
    qwen = load_builtin_modelfile("qwen3.6-35b")
    assert qwen.default.source == Source("hf", repo_id="Qwen/Qwen3.6-35B-A3B")
    assert (qwen.default.family, qwen.default.dtype) == ("qwen3_5_moe", "bf16")
    assert qwen.recipe("fp8").dtype == "fp8" and qwen.recipe("fp8").source.repo_id == "Qwen/Qwen3.6-35B-A3B-FP8"
    assert load_builtin_modelfile("glm-5.2").recipe("fp8").family == "glm_moe_dsa"
    assert load_builtin_modelfile("deepseek-v3").default.dtype == "fp8"
    assert {"latest", "instruct-2507", "fp8"} <= set(load_builtin_modelfile("qwen3-30b-a3b").tags)
    tiny = load_builtin_modelfile("tiny").default
    assert (tiny.source, tiny.family, tiny.dtype, tiny.template) == (
        Source("builtin", path="tiny"), "qwen3_moe", "f32", "checkpoint")


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_shipped_modelfile_parses_round_trips_and_has_valid_sources(name):
    path = SHIPPED[name]
    mf = load_modelfile(path)
    assert mf.name == name and mf.path == path and "latest" in mf.tags
    assert parse_modelfile(mf.to_text(), name=name, path=path) == mf
    for tag, recipe in mf.tags.items():
        assert recipe.tag == tag and recipe.name == name
        assert recipe.dtype in DTYPES and recipe.family
        assert parse_source(recipe.source.uri()) == recipe.source
        if recipe.source.scheme in ("hf", "gguf"):
            assert HF_REPO.fullmatch(recipe.source.repo_id)
        else:
            assert recipe.source.scheme == "builtin"
    text = path.read_text(encoding="utf-8")
    assert name == "tiny" or "# verified:" in text  # every real repo id says where it was checked


def test_supported_families_filter_applies_to_shipped_recipes():
    assert load_builtin_modelfile("qwen3.6-35b", supported_families={"qwen3_5_moe"}).default.family == "qwen3_5_moe"
    with pytest.raises(ModelfileError, match="family 'deepseek_v4' is not supported"):
        load_builtin_modelfile("deepseek-v4-flash", supported_families={"qwen3_moe", "deepseek_v3"})
    with pytest.raises(ModelfileError, match="available: .*qwen3.6-35b"):
        load_builtin_modelfile("nope")


# --- format ---------------------------------------------------------------------------------------

BRIEF_EXAMPLE = '''\
# comment lines and blank lines are ignored
DESCRIPTION "Qwen3.6 35B-A3B: hybrid linear attention MoE, 256 experts, 8 active"
FROM hf://Qwen/Qwen3.6-35B-A3B@main    # source: hf://org/repo[@revision]
FAMILY qwen3_5_moe                     # architecture family id
DTYPE bf16
TEMPLATE checkpoint
SYSTEM """You are a helpful assistant."""
PARAMETER temperature 0.7
PARAMETER top_p 0.8
PARAMETER stop "<|im_end|>"            # repeatable keys accumulate into a list
PARAMETER stop "<|endoftext|>"
LICENSE apache-2.0
CONTEXT 262144                          # optional default context length

TAG fp8                                 # inherits everything above, overrides what it states
FROM hf://Qwen/Qwen3.6-35B-A3B-FP8
DTYPE fp8
PARAMETER temperature 0.6

tag instruct
from hf://Qwen/Qwen3-30B-A3B-Instruct-2507
parameter STOP "<|im_end|>"
'''


def test_brief_example_and_tag_inheritance():
    mf = parse(BRIEF_EXAMPLE, name="qwen3.6-35b")
    base, fp8, instruct = mf.default, mf.recipe("FP8"), mf.recipe("instruct")
    assert list(mf.tags) == ["latest", "fp8", "instruct"] and mf.recipe() is base
    assert base.source == Source("hf", repo_id="Qwen/Qwen3.6-35B-A3B", revision="main")
    assert base.system == "You are a helpful assistant." and base.template == "checkpoint"
    assert base.parameters == {"temperature": 0.7, "top_p": 0.8, "stop": ("<|im_end|>", "<|endoftext|>")}
    assert (base.license, base.context_length, base.ref) == ("apache-2.0", 262144, "qwen3.6-35b:latest")
    # a tag overrides what it states and inherits the rest
    assert (fp8.dtype, fp8.source.repo_id, fp8.parameters["temperature"]) == ("fp8", "Qwen/Qwen3.6-35B-A3B-FP8", 0.6)
    assert (fp8.family, fp8.system, fp8.context_length, fp8.parameters["top_p"]) == ("qwen3_5_moe", base.system, 262144, 0.8)
    # tags inherit from the lines before the first TAG, not from the previous TAG; a stated stop replaces the list
    assert instruct.dtype == "bf16" and instruct.parameters["temperature"] == 0.7
    assert instruct.parameters["stop"] == ("<|im_end|>",)
    assert parse(mf.to_text(), name="qwen3.6-35b") == mf


def test_unknown_tag_error_lists_tags_and_is_a_key_error():
    mf = parse(BRIEF_EXAMPLE)
    with pytest.raises(UnknownTagError) as info:
        mf.recipe("q4")
    assert isinstance(info.value, KeyError) and isinstance(info.value, ModelfileError)
    assert str(info.value) == "Modelfiles/x.Modelfile: m has no tag 'q4' (available: latest, fp8, instruct)"


def test_triple_quoted_blocks_are_verbatim_and_keep_line_numbers():
    template = '{%- for m in messages %}\n# not a comment "quoted" \\n {{ m.content }}\n{%- endfor %}\n'
    text = f'FROM hf://a/b\nFAMILY x\nTEMPLATE """\n{template}"""   # trailing comment\nSYSTEM """one\ntwo"""\nFORM y\n'
    err = error_of(text)
    assert err.line_number == 10 and "unknown instruction 'FORM'" in str(err)
    mf = parse(text.replace("FORM y\n", ""))
    assert mf.default.template == template  # the newline right after the opening quotes is dropped
    assert mf.default.system == "one\ntwo"
    assert parse(mf.to_text()) == mf


def test_double_quoted_escapes_crlf_and_case_insensitive_instructions():
    text = 'from "hf://a/b"\r\nfamily QWEN3_MOE\r\nsystem "say \\"hi\\"\\\\ \\n\\tC:\\models"\r\ndtype BF16\r\n'
    recipe = parse(text).default
    assert recipe.system == 'say "hi"\\ \n\tC:\\models' and recipe.family == "qwen3_moe" and recipe.dtype == "bf16"
    assert parse(parse(text).to_text()).default == recipe


def test_to_text_round_trips_awkward_strings():
    for value in ['a"b', "back\\slash", "tab\there", 'line\nbreak"', 'has """ inside\nand newline', "\n\nlead",
                  "trail\n", "#hash", "\\n literal"]:
        text = f"FROM ./weights\nFAMILY x\nSYSTEM {_quote_for_test(value)}\nLICENSE {_quote_for_test(value)}\n"
        mf = parse(text)
        assert mf.default.system == value and mf.default.license == value
        assert parse(mf.to_text()) == mf


def _quote_for_test(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\t", "\\t") + '"'


# --- sources --------------------------------------------------------------------------------------

def test_parse_source_schemes(tmp_path):
    assert parse_source("hf://Qwen/Qwen3-30B-A3B@refs/pr/1") == Source("hf", "Qwen/Qwen3-30B-A3B", "refs/pr/1")
    assert parse_source("gguf://Qwen/Qwen3-30B-A3B-GGUF/Q4/Qwen3-30B-A3B-Q4_K_M.gguf@main") == Source(
        "gguf", "Qwen/Qwen3-30B-A3B-GGUF", "main", "Q4/Qwen3-30B-A3B-Q4_K_M.gguf")
    assert parse_source("builtin://tiny") == Source("builtin", path="tiny")
    assert parse_source("weights/qwen", tmp_path) == Source("local", path=str(tmp_path / "weights" / "qwen"))
    assert parse_source(str(tmp_path)) == Source("local", path=str(tmp_path))
    for uri in ("hf://Qwen/Qwen3-30B-A3B@main", "gguf://a/b/c.gguf", "builtin://tiny", str(tmp_path)):
        assert parse_source(uri).uri() == uri


@pytest.mark.parametrize("uri", [
    "hf://gpt2", "hf://a/b/c", "hf://-a/b", "hf://a/b..c", "hf://a--b/c", "hf://a/b c", "hf://a/" + "b" * 95,
    "hf://a/b@", "hf://a/b@x@y", "hf://a/b@../x", "hf://a/b.", "gguf://a/b", "gguf://a/b/c.bin",
    "gguf://a/b/../c.gguf", "builtin://Tiny", "builtin://", "s3://bucket/x", "", " hf://a/b", "hf://a/b\n",
])
def test_parse_source_rejects(uri):
    with pytest.raises(ValueError):
        parse_source(uri)


def test_local_source_resolves_against_the_modelfile_directory(tmp_path):
    (tmp_path / "my.Modelfile").write_text("FROM ./ckpt\nFAMILY mixtral\n", encoding="utf-8")
    mf = load_modelfile(tmp_path / "my.Modelfile")
    assert mf.name == "my" and mf.default.source == Source("local", path=str(tmp_path / "ckpt"))
    assert parse_modelfile(mf.to_text(), name="my", path=mf.path) == mf


# --- errors, each with its line -------------------------------------------------------------------

OK = "FROM hf://a/b\nFAMILY mixtral\n"


@pytest.mark.parametrize(("text", "line", "message"), [
    (OK + "\nFORM hf://a/b\n", 4, "unknown instruction 'FORM' (expected one of FROM, FAMILY, DTYPE"),
    (OK + "ADAPTER ./lora\n", 3, "not supported by ft 'ADAPTER'"),
    (OK + "PARAMETER presence_pen 1.5\n", 3, "unknown PARAMETER 'presence_pen' (expected one of temperature"),
    ("# nothing\nFAMILY mixtral\n", 2, "missing FROM"),
    ("FROM hf://a/b\n\nTAG fp8\nFAMILY x\n", 3, "missing FAMILY"),
    (OK + "TAG fp8\nDTYPE fp8\nTAG fp8\n", 5, "TAG fp8 defined twice (first at line 3)"),
    (OK + "TAG latest\n", 3, "TAG latest defined twice"),
    (OK + 'SYSTEM "never closed\nDTYPE bf16\n', 3, "unterminated string"),
    (OK + 'TEMPLATE """{{ x }}\n\n', 3, 'unterminated """ block'),
    ("FAMILY mixtral\n\nFROM hf://a/b/c\n", 3, "must be hf://org/name"),
    ("FROM s3://bucket/x\n", 1, "unknown source scheme 's3://'"),
    ("FROM hf://a..b/c\n", 1, "not a valid Hugging Face repo id"),
    (OK + "DTYPE int3\n", 3, "unknown DTYPE 'int3' (expected one of auto, bf16"),
    (OK + "PARAMETER top_p 0\n", 3, "PARAMETER top_p: expected a number in (0, 1]"),
    (OK + "PARAMETER temperature -0.1\n", 3, "expected a number >= 0"),
    (OK + "PARAMETER temperature nan\n", 3, "expected a number >= 0"),
    (OK + "PARAMETER top_k 2.5\n", 3, "expected an integer >= 0"),
    (OK + "PARAMETER num_ctx 0\n", 3, "PARAMETER num_ctx"),
    (OK + "PARAMETER num_predict -2\n", 3, "PARAMETER num_predict"),
    (OK + "PARAMETER min_p 1.5\n", 3, "PARAMETER min_p"),
    (OK + "PARAMETER stop\n", 3, "expected PARAMETER <key> <value>"),
    (OK + 'PARAMETER stop ""\n', 3, "non-empty"),
    (OK + "PARAMETER seed 1\nPARAMETER seed 2\n", 4, "PARAMETER seed given twice in one section (first at line 3)"),
    (OK + "FROM hf://c/d\n", 3, "FROM given twice in one section (first at line 1)"),
    (OK + 'LICENSE "apache" 2.0\n', 3, "LICENSE takes one value, got 2 values"),
    (OK + "CONTEXT 128k\n", 3, "CONTEXT must be a positive integer"),
    (OK + "TEMPLATE chatml\n", 3, "TEMPLATE takes `checkpoint` or a quoted template"),
    (OK + 'TEMPLATE """{% if system %}{{ system }}"""\n', 3, "TEMPLATE: chat template syntax error on line 1"),
    (OK + 'TEMPLATE """{{ printf "%s" .Prompt }}"""\n', 3,
     "TEMPLATE: the function `printf` (with 2 operands) has no translation here; this is an Ollama (Go) template"),
    (OK + 'TEMPLATE """{{ range .Messages }}{{ .Content }}"""\n', 3, "a `{{ range }}` without its `{{ end }}`"),
    (OK + 'TEMPLATE """{{ .Context }}"""\n', 3, ".Context is not a value Ollama gives a template"),
    (OK + 'TEMPLATE """{% for m in messages %}{{ m.content }}"""\n', 3, "TEMPLATE: chat template syntax error"),
    (OK + 'DTYPE b"f16\n', 3, "stray quote"),
    (OK + 'SYSTEM "a"b\n', 3, "unexpected text right after a closing quote"),
    (OK + "TAG Bad/Tag\n", 3, "tag 'bad/tag' must match"),
    (OK + "FAMILY Qwen 3\n", 3, "FAMILY takes one value"),
    (OK + "FAMILY qwen3-moe!\n", 3, "must be a config model_type"),
    ("FROM hf://a/b\nFAMILY x\nSYSTEM ok\x00\n", 3, "NUL byte"),
])
def test_errors_name_the_line(text, line, message):
    err = error_of(text)
    assert err.line_number == line and message in err.message
    assert str(err) == f"Modelfiles/x.Modelfile:{line}: {err.message}"


def test_ollama_modelfiles_parse_as_ollama_reads_them(caplog):
    """Unquoted prose is the rest of the line (quotes and # included), as Ollama reads SYSTEM,
    LICENSE and DESCRIPTION; Ollama's PARAMETERs ft has no use for are ignored with a warning
    that says why, not refused; the others are still checked."""
    import logging

    text = OK + 'SYSTEM You are a "pirate".  #1 at sea\nLICENSE apache 2.0\nPARAMETER num_gpu 99\n' \
                'PARAMETER num_thread 8\nPARAMETER mirostat 2\nPARAMETER temperature 0.5\n'
    with caplog.at_level(logging.WARNING, logger="ftpull.modelfile"):
        recipe = parse_modelfile(text, name="x").recipe()
    assert recipe.system == 'You are a "pirate".  #1 at sea' and recipe.license == "apache 2.0"
    assert dict(recipe.parameters) == {"temperature": 0.5}
    assert "PARAMETER num_gpu is ignored: ft places weights itself" in caplog.text
    assert "num_thread is ignored" in caplog.text and "mirostat is ignored" in caplog.text
    assert parse_modelfile(recipe_text := OK + 'SYSTEM """a\nb"""\n', name="x").recipe().system == "a\nb", recipe_text


def test_unsupported_family_names_the_supported_list():
    err = error_of(OK.replace("mixtral", "dbrx"), supported_families={"mixtral", "qwen3_moe"})
    assert str(err) == "Modelfiles/x.Modelfile:2: family 'dbrx' is not supported (supported: mixtral, qwen3_moe)"


def test_size_cap_and_bad_files(tmp_path):
    assert "larger than" in str(error_of(OK + "#" * MAX_MODELFILE_BYTES))
    big = tmp_path / "big.Modelfile"
    big.write_bytes(b"#" * (MAX_MODELFILE_BYTES + 10))
    with pytest.raises(ModelfileError, match="larger than"):
        load_modelfile(big)
    bad = tmp_path / "bad.Modelfile"
    bad.write_bytes(OK.encode() + b"SYSTEM \xff\n")
    with pytest.raises(ModelfileError) as info:
        load_modelfile(bad)
    assert info.value.line_number == 3 and "UTF-8" in str(info.value)
    with pytest.raises(ModelfileError, match="cannot read"):
        load_modelfile(tmp_path / "missing.Modelfile")
    with pytest.raises(ModelfileError, match="whitespace"):
        load_modelfile(tmp_path / "has space.Modelfile")


# --- garbage in: only ModelfileError, and whatever parses round-trips ------------------------------

FRAGMENTS = ["FROM ", "FAMILY ", "DTYPE ", "TEMPLATE ", "SYSTEM ", "PARAMETER ", "LICENSE ", "DESCRIPTION ", "CONTEXT ",
             "TAG ", "from ", "stop ", "temperature ", "top_k ", "hf://a/b", "hf://", "gguf://a/b/c.gguf", "builtin://tiny",
             "./w", "@main", "qwen3_moe", "fp8", "checkpoint", "latest", '"', '"""', "\\", "\\n", "#", " ", "\t", "\n", "\r\n",
             "\r", "0.5", "-1", "1e9", "nan", "x", "é", "\u2028", "\x00", "\x0b", "{{ }}", "'", "@", "/", "..", "--"]
SEED_TEXT = "FROM hf://a/b\nFAMILY qwen3_moe\nPARAMETER stop \"<|im_end|>\"\nTEMPLATE \"\"\"\n{{ x }}\n\"\"\"\nTAG fp8\nDTYPE fp8\n"


def _check_garbage(text: str) -> None:
    try:
        mf = parse_modelfile(text, name="g")
    except ModelfileError as e:
        assert str(e)
        return
    assert parse_modelfile(mf.to_text(), name="g") == mf


def test_random_garbage_only_raises_modelfile_error():
    rng = random.Random(20240601)
    corpus = [SEED_TEXT] + [p.read_text(encoding="utf-8") for p in SHIPPED.values()]
    for _ in range(3000):
        text = "".join(rng.choice(FRAGMENTS) for _ in range(rng.randint(0, 40)))
        _check_garbage(text)
        _check_garbage(SEED_TEXT + text)
    for _ in range(3000):  # mutate real Modelfiles: delete, duplicate or inject at random points
        chars = list(rng.choice(corpus))
        for _ in range(rng.randint(1, 6)):
            at = rng.randrange(len(chars) + 1)
            op = rng.random()
            if op < 0.4 and chars:
                del chars[at:at + rng.randint(1, 8)]
            elif op < 0.7:
                chars[at:at] = rng.choice(FRAGMENTS)
            else:
                chars[at:at] = chars[at:at + rng.randint(1, 20)]
        _check_garbage("".join(chars))
    for _ in range(500):  # raw random code points
        _check_garbage("".join(chr(rng.randrange(0x110000)) for _ in range(rng.randint(0, 80))))


def test_shipped_dir_is_the_package_dir():
    import Modelfiles

    assert all(p.parent == Path(Modelfiles.__file__).parent for p in SHIPPED.values())
