"""Modelfiles: one recipe per model name, Ollama-compatible where the two overlap.

The format is specified in docs/MODELFILE.md ("Modelfile format 1"). Parsing is defensive: a size
cap, no code execution, and no file reads beyond the Modelfile itself (local sources are resolved
as strings, never opened). Every problem a user can cause raises ModelfileError naming the file
and line. Standard library only, so the CLI can list recipes without importing torch.
"""

from __future__ import annotations

import logging
import math
import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from importlib import resources
from pathlib import Path
from typing import Any, cast

from .sources import URI, Source, SourceScheme, parse_source  # noqa: F401 - Source is part of the Modelfile API

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
MAX_MODELFILE_BYTES = 1 << 20
DEFAULT_TAG = "latest"
FAMILY_FROM_CONFIG = "auto"  # FAMILY auto: pull reads it from the checkpoint (the default for a local FROM)
TEMPLATE_FROM_CHECKPOINT = "checkpoint"  # TEMPLATE checkpoint: use tokenizer_config.json's chat_template
DTYPES = ("auto", "bf16", "f16", "f32", "fp8", "q8_0", "q4_k", "q5_k", "q6_k")
INSTRUCTIONS = ("FROM", "FAMILY", "DTYPE", "TEMPLATE", "SYSTEM", "PARAMETER", "MESSAGE", "LICENSE", "DESCRIPTION",
                "CONTEXT", "TAG")
OLLAMA_ONLY = ("ADAPTER", "REQUIRES")  # valid Ollama, meaningless for ft
MESSAGE_ROLES = ("system", "user", "assistant")  # MESSAGE ROLE TEXT: the conversation a run starts with
PROSE = ("SYSTEM", "LICENSE", "DESCRIPTION")  # unquoted, their value is the rest of the line
# Ollama's PARAMETERs that ft has no use for, and why: a Modelfile written for Ollama keeps them,
# and ft says it ignores them rather than refusing the file
IGNORED_PARAMETERS = {
    **dict.fromkeys(("num_gpu", "main_gpu", "low_vram", "num_batch", "use_mmap", "use_mlock", "numa"),
                    "ft places weights itself, by its fit plan (ft fit; --device, --vram-gib)"),
    "num_thread": "threads are `ft run --threads` or the server's, by the fit plan",
    "num_keep": "ft keeps the conversation's prefix cached without it",
    **dict.fromkeys(("mirostat", "mirostat_eta", "mirostat_tau", "tfs_z", "typical_p", "penalize_newline",
                     "presence_penalty", "frequency_penalty"), "ft's sampler does not implement it"),
}

ParamValue = float | int | tuple[str, ...]

_FAMILY = re.compile(r"[a-z0-9][a-z0-9_.-]{0,63}")
_TAG = re.compile(r"[a-z0-9_][a-z0-9._-]{0,127}")
_INT = re.compile(r"[+-]?[0-9]{1,20}")
_FLOAT = re.compile(r"[+-]?(?:[0-9]{1,30}(?:\.[0-9]{0,30})?|\.[0-9]{1,30})(?:[eE][+-]?[0-9]{1,3})?")
_BARE_SAFE = re.compile(r'[^\s"#\\]+')


class ModelfileError(ValueError):
    """A Modelfile that cannot be used; str() reads `path:line: message`."""

    def __init__(self, path: str | os.PathLike[str] | None, line_number: int | None, message: str):
        super().__init__(path, line_number, message)
        self.path = None if path is None else str(path)
        self.line_number = line_number
        self.message = message

    def __str__(self) -> str:
        where = self.path or "<modelfile>"
        return f"{where}:{self.line_number}: {self.message}" if self.line_number else f"{where}: {self.message}"


class UnknownTagError(ModelfileError, KeyError):
    """Modelfile.recipe() was asked for a tag the Modelfile does not define."""



@dataclass(frozen=True)
class Recipe:
    """One resolved tag of a Modelfile: everything pull and run need to know."""

    name: str
    tag: str
    source: Source
    family: str
    dtype: str = "auto"
    template: str | None = None  # TEMPLATE_FROM_CHECKPOINT, jinja text, or None (none stated)
    system: str | None = None
    parameters: Mapping[str, ParamValue] = field(default_factory=dict)  # stop is a tuple of strings
    license: str | None = None
    description: str | None = None
    context_length: int | None = None
    messages: tuple[tuple[str, str], ...] = ()  # (role, content) per MESSAGE: the history a run starts with

    def __post_init__(self) -> None:
        object.__setattr__(self, "parameters", dict(self.parameters))  # never alias the caller's dict
        object.__setattr__(self, "messages", tuple((str(r), str(c)) for r, c in self.messages))

    @property
    def ref(self) -> str:
        return f"{self.name}:{self.tag}"


@dataclass(frozen=True)
class Modelfile:
    """A parsed Modelfile: the `latest` recipe and every tag (latest included, file order)."""

    path: Path | None
    default: Recipe
    tags: Mapping[str, Recipe]

    @property
    def name(self) -> str:
        return self.default.name

    def recipe(self, tag: str | None = None) -> Recipe:
        key = (tag or DEFAULT_TAG).lower()
        if key not in self.tags:
            raise UnknownTagError(self.path, None, f"{self.name} has no tag {tag!r} (available: {', '.join(self.tags)})")
        return self.tags[key]

    def to_text(self) -> str:
        """Canonical text that parses back to an equal Modelfile (same name and path)."""
        out = [f"# Modelfile format {FORMAT_VERSION}: {self.name}"]
        out += _recipe_lines(self.default, None)
        for tag, recipe in self.tags.items():
            if tag != DEFAULT_TAG:
                out += ["", f"TAG {tag}"] + _recipe_lines(recipe, self.default)
        return "\n".join(out) + "\n"


# Known PARAMETER keys: converter returning the value or raising ValueError with the rule broken.
def _float(check: str, ok: Callable[[float], bool]) -> Callable[[str], float]:
    def convert(text: str) -> float:
        if not _FLOAT.fullmatch(text) or not math.isfinite(value := float(text)) or not ok(value):
            raise ValueError(f"expected a number {check}, got {text!r}")
        return value
    return convert


def _int(check: str, ok: Callable[[int], bool]) -> Callable[[str], int]:
    def convert(text: str) -> int:
        if not _INT.fullmatch(text) or not ok(value := int(text)):
            raise ValueError(f"expected an integer {check}, got {text!r}")
        return value
    return convert


PARAMETERS: dict[str, Callable[[str], ParamValue] | None] = {
    "temperature": _float(">= 0", lambda v: v >= 0),
    "top_p": _float("in (0, 1]", lambda v: 0 < v <= 1),
    "top_k": _int(">= 0", lambda v: v >= 0),
    "min_p": _float("in [0, 1]", lambda v: 0 <= v <= 1),
    "repeat_penalty": _float("> 0", lambda v: v > 0),
    "repeat_last_n": _int(">= -1 (-1 = whole context)", lambda v: v >= -1),
    "seed": _int("in the 64-bit range", lambda v: -(2**63) <= v < 2**64),
    "num_ctx": _int("> 0", lambda v: 0 < v < 2**31),
    "num_predict": _int(">= -1 (-1 = unlimited)", lambda v: -1 <= v < 2**31),
    "stop": None,  # repeatable string; accumulates into a tuple
}


@dataclass
class _Token:
    text: str
    quoted: bool


def _tokenize(text: str, path: str | None) -> Iterable[tuple[int, str, list[_Token]]]:
    """Yield (line number, instruction word, value tokens) per instruction. An unquoted SYSTEM,
    LICENSE or DESCRIPTION is one token: the rest of its line."""
    n, i, line = len(text), 0, 1
    while i < n:
        c = text[i]
        if c in " \t":
            i += 1
        elif c == "\n":
            i, line = i + 1, line + 1
        elif c == "#":
            i = _line_end(text, i)
        else:
            start, start_line = i, line
            while i < n and text[i] not in " \t\n":
                i += 1
            word, tokens = text[start:i], []
            while i < n and text[i] in " \t":
                i += 1
            if word.upper() == "MESSAGE" and i < n and text[i] not in '"\n':
                # `MESSAGE user Hello there`: the role, then the rest of the line unless it is quoted
                role_end = i
                while role_end < n and text[role_end] not in " \t\n":
                    role_end += 1
                tokens.append(_Token(text[i:role_end], False))
                i = role_end
                while i < n and text[i] in " \t":
                    i += 1
                if i < n and text[i] not in '"\n':
                    end = _line_end(text, i)
                    yield start_line, word, [*tokens, _Token(text[i:end].rstrip(), False)]
                    i = end
                    continue
            if word.upper() in PROSE and i < n and text[i] not in '"\n':
                # `SYSTEM You are a "pirate" #1`: the rest of the line as written, as Ollama reads it
                end = _line_end(text, i)
                yield start_line, word, [_Token(text[i:end].rstrip(), False)]
                i = end
                continue
            while True:
                while i < n and text[i] in " \t":
                    i += 1
                if i >= n or text[i] == "\n":
                    break
                if text[i] == "#":
                    i = _line_end(text, i)
                    break
                if text.startswith('"""', i):
                    end = text.find('"""', i + 3)
                    if end < 0:
                        raise ModelfileError(path, line, 'unterminated """ block (no closing """)')
                    raw = text[i + 3:end]
                    line += raw.count("\n")
                    tokens.append(_Token(raw[1:] if raw.startswith("\n") else raw, True))
                    i = end + 3
                elif text[i] == '"':
                    value, i = _quoted(text, i, path, line)
                    tokens.append(_Token(value, True))
                else:
                    begin = i
                    while i < n and text[i] not in " \t\n":
                        i += 1
                    if '"' in text[begin:i]:
                        raise ModelfileError(path, line, f"stray quote in value {_show(text[begin:i])}")
                    tokens.append(_Token(text[begin:i], False))
                    continue
                if i < n and text[i] not in " \t\n":
                    raise ModelfileError(path, line, "unexpected text right after a closing quote")
            yield start_line, word, tokens


def _line_end(text: str, i: int) -> int:
    end = text.find("\n", i)
    return len(text) if end < 0 else end


_ESCAPES = {'"': '"', "\\": "\\", "n": "\n", "t": "\t"}


def _quoted(text: str, i: int, path: str | None, line: int) -> tuple[str, int]:
    out, i = [], i + 1
    while i < len(text) and text[i] != "\n":
        c = text[i]
        if c == '"':
            return "".join(out), i + 1
        if c == "\\" and i + 1 < len(text) and text[i + 1] in _ESCAPES:
            out.append(_ESCAPES[text[i + 1]])
            i += 2
            continue
        out.append(c)
        i += 1
    raise ModelfileError(path, line, 'unterminated string (a "..." value must close on its own line)')


def _show(word: str) -> str:
    return repr(word if len(word) <= 40 else word[:40] + "...")


def parse_modelfile(text: str, *, name: str, path: str | os.PathLike[str] | None = None,
                    supported_families: set[str] | None = None) -> Modelfile:
    """Parse Modelfile text into its `latest` recipe and tags; see docs/MODELFILE.md.

    Relative local sources resolve against the directory of `path`. When supported_families is
    given, a FAMILY outside it is an error (the converter's list); otherwise any family is kept.
    """
    if not isinstance(name, str) or not name or any(c.isspace() for c in name):
        raise ValueError(f"model name {name!r} must be a non-empty string without whitespace")
    where = None if path is None else os.fspath(path)
    if len(text.encode("utf-8", "surrogatepass")) > MAX_MODELFILE_BYTES:
        raise ModelfileError(where, None, f"larger than {MAX_MODELFILE_BYTES} bytes; not a Modelfile")
    if "\0" in text:
        raise ModelfileError(where, text[: text.index("\0")].count("\n") + 1, "NUL byte in Modelfile")
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    base_dir = os.path.dirname(os.path.abspath(where)) if where else None
    sections = [_Section(DEFAULT_TAG, 1)]
    for line, word, tokens in _tokenize(text, where):
        instruction = word.upper() if word.isascii() else word
        if instruction == "TAG":
            tag = _single(where, line, instruction, tokens).lower()
            if not _TAG.fullmatch(tag):
                raise ModelfileError(where, line, f"tag {_show(tag)} must match [a-z0-9_][a-z0-9._-]*")
            for other in sections:
                if other.tag == tag:
                    first = f"line {other.line}" if tag != DEFAULT_TAG else "the lines before the first TAG"
                    raise ModelfileError(where, line, f"TAG {tag} defined twice (first at {first})")
            sections.append(_Section(tag, line))
            continue
        section = sections[-1]
        if instruction == "PARAMETER":
            _parameter(where, line, tokens, section.params)
            continue
        if instruction == "MESSAGE":
            section.messages.append(_message(where, line, tokens))
            continue
        if instruction not in INSTRUCTIONS:
            hint = "not supported by ft" if instruction in OLLAMA_ONLY else "unknown instruction"
            raise ModelfileError(where, line, f"{hint} {_show(word)} (expected one of {', '.join(INSTRUCTIONS)})")
        key, value = _field(where, line, instruction, _single(where, line, instruction, tokens), tokens[0].quoted,
                            base_dir, supported_families)
        if key in section.fields:
            first = section.fields[key][1]
            raise ModelfileError(where, line, f"{instruction} given twice in one section (first at line {first})")
        section.fields[key] = (value, line)
    return _build(where, name, text, sections)


def _single(where: str | None, line: int, instruction: str, tokens: list[_Token]) -> str:
    if len(tokens) != 1:
        got = "nothing" if not tokens else f"{len(tokens)} values (quote values that contain spaces)"
        raise ModelfileError(where, line, f"{instruction} takes one value, got {got}")
    return tokens[0].text


def _field(where: str | None, line: int, instruction: str, value: str, quoted: bool, base_dir: str | None,
           supported_families: set[str] | None) -> tuple[str, object]:
    try:
        if instruction == "FROM":
            return "source", parse_source(value, base_dir)
        if instruction == "FAMILY":
            family = value.lower()
            if not _FAMILY.fullmatch(family):
                raise ValueError(f"family {_show(value)} must be a config model_type such as qwen3_moe")
            if supported_families is not None and family not in supported_families:
                raise ValueError(f"family {family!r} is not supported (supported: {', '.join(sorted(supported_families))})")
            return "family", family
        if instruction == "DTYPE":
            if value.lower() not in DTYPES:
                raise ValueError(f"unknown DTYPE {_show(value)} (expected one of {', '.join(DTYPES)})")
            return "dtype", value.lower()
        if instruction == "CONTEXT":
            if not _INT.fullmatch(value) or not 0 < int(value) < 2**31:
                raise ValueError(f"CONTEXT must be a positive integer, got {_show(value)}")
            return "context_length", int(value)
        if instruction == "TEMPLATE" and not quoted and value.lower() == TEMPLATE_FROM_CHECKPOINT:
            return "template", TEMPLATE_FROM_CHECKPOINT
        if instruction == "TEMPLATE" and not quoted:
            raise ValueError(f'TEMPLATE takes `checkpoint` or a quoted template, got {_show(value)}')
        if instruction == "TEMPLATE":
            value = _jinja_template(value)
        return instruction.lower(), value  # SYSTEM, LICENSE, DESCRIPTION, quoted TEMPLATE
    except ValueError as e:
        raise ModelfileError(where, line, str(e)) from None


def _parameter(where: str | None, line: int, tokens: list[_Token], params: dict) -> None:
    if len(tokens) != 2:
        raise ModelfileError(where, line, f"expected PARAMETER <key> <value>, got {len(tokens)} values after PARAMETER")
    key, value = tokens[0].text.lower(), tokens[1].text
    if key in IGNORED_PARAMETERS:
        log.warning("%s:%d: PARAMETER %s is ignored: %s", where or "Modelfile", line, key, IGNORED_PARAMETERS[key])
        return
    if key not in PARAMETERS:
        raise ModelfileError(where, line, f"unknown PARAMETER {_show(tokens[0].text)} (expected one of {', '.join(PARAMETERS)})")
    if key == "stop":
        if not value:
            raise ModelfileError(where, line, "PARAMETER stop needs a non-empty string")
        stops, first = params.get("stop", ((), line))
        params["stop"] = (stops + (value,), first)
        return
    if key in params:
        raise ModelfileError(where, line, f"PARAMETER {key} given twice in one section (first at line {params[key][1]})")
    try:
        params[key] = (PARAMETERS[key](value), line)
    except ValueError as e:
        raise ModelfileError(where, line, f"PARAMETER {key}: {e}") from None


def _message(where: str | None, line: int, tokens: list[_Token]) -> tuple[str, str]:
    if len(tokens) != 2:
        raise ModelfileError(where, line, f"expected MESSAGE <role> <text>, got {len(tokens)} values after MESSAGE")
    role, content = tokens[0].text.lower(), tokens[1].text
    if role not in MESSAGE_ROLES:
        raise ModelfileError(where, line, f"MESSAGE role {_show(tokens[0].text)} is not one of {', '.join(MESSAGE_ROLES)}")
    return role, content


@dataclass
class _Section:
    """What one section (the lines before the first TAG, or one TAG) states, with line numbers."""

    tag: str
    line: int
    fields: dict[str, tuple[object, int]] = field(default_factory=dict)
    params: dict[str, tuple[ParamValue, int]] = field(default_factory=dict)
    messages: list[tuple[str, str]] = field(default_factory=list)  # a TAG's MESSAGEs replace the base's


def _build(where: str | None, name: str, text: str, sections: list[_Section]) -> Modelfile:
    # Every TAG inherits from the lines before the first TAG (not from earlier TAGs) and
    # overrides what it states; a PARAMETER it states replaces that key (stop: the whole list).
    base = sections[0]
    end_line = sections[1].line if len(sections) > 1 else max(1, text.count("\n") + (not text.endswith("\n")))
    if "source" in base.fields and "family" not in base.fields \
            and cast(Source, base.fields["source"][0]).scheme == "local":  # a directory or a stored model says it
        base.fields["family"] = (FAMILY_FROM_CONFIG, 0)
    for key, instruction in (("source", "FROM"), ("family", "FAMILY")):
        if key not in base.fields:
            raise ModelfileError(where, end_line, f"missing {instruction} (the lines before the first TAG must state it)")
    tags: dict[str, Recipe] = {}
    for section in sections:
        merged = {k: v for k, (v, _) in base.fields.items()}
        merged.update({k: v for k, (v, _) in section.fields.items()})
        params = {k: v for k, (v, _) in base.params.items()}
        params.update({k: v for k, (v, _) in section.params.items()})
        messages = tuple(section.messages or base.messages)
        tags[section.tag] = Recipe(name=name, tag=section.tag, parameters=params, messages=messages,
                                   **merged)  # type: ignore[arg-type]
    return Modelfile(path=None if where is None else Path(where), default=tags[DEFAULT_TAG], tags=tags)


def load_modelfile(path: str | os.PathLike[str], *, name: str | None = None,
                   supported_families: set[str] | None = None) -> Modelfile:
    """Read and parse one Modelfile; the model name defaults to the file stem."""
    p = Path(path)
    name = name or p.stem
    if any(c.isspace() for c in name) or not name:
        raise ModelfileError(p, None, f"model name {name!r} (from the file name) must not contain whitespace")
    try:
        with open(p, "rb") as f:
            data = f.read(MAX_MODELFILE_BYTES + 1)
    except OSError as e:
        raise ModelfileError(p, None, f"cannot read Modelfile: {e.strerror or e}") from None
    if len(data) > MAX_MODELFILE_BYTES:
        raise ModelfileError(p, None, f"larger than {MAX_MODELFILE_BYTES} bytes; not a Modelfile")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ModelfileError(p, data[: e.start].count(b"\n") + 1, "not valid UTF-8 text") from None
    return parse_modelfile(text.removeprefix("\ufeff"), name=name, path=p, supported_families=supported_families)


def builtin_modelfiles() -> dict[str, Path]:
    """The recipes shipped in the Modelfiles package: model name (file stem) -> path."""
    found = {}
    for entry in resources.files("Modelfiles").iterdir():
        if entry.name.endswith(".Modelfile") and entry.is_file():
            found[entry.name[: -len(".Modelfile")]] = Path(os.fspath(entry))
    return dict(sorted(found.items()))


def load_builtin_modelfile(name: str, *, supported_families: set[str] | None = None) -> Modelfile:
    """Parse the shipped recipe for `name`; ModelfileError lists the names when there is none."""
    shipped = builtin_modelfiles()
    if name not in shipped:
        raise ModelfileError(None, None, f"no shipped Modelfile named {name!r} (available: {', '.join(shipped)})")
    return load_modelfile(shipped[name], name=name, supported_families=supported_families)


# --- canonical text -------------------------------------------------------------------------------

def _quote(text: str) -> str:
    if "\n" in text and '"""' not in text and not text.endswith('"'):
        return '"""\n' + text + '"""'  # the parser drops the newline right after the opening quotes
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\t", "\\t")
    return f'"{escaped}"'


def _word(text: str) -> str:
    return text if _BARE_SAFE.fullmatch(text) and not URI.fullmatch(text) and text != TEMPLATE_FROM_CHECKPOINT else _quote(text)


def _format_param(value: ParamValue) -> str:
    return repr(value) if isinstance(value, float) else str(value)


def variant_modelfile(base: str, *, system: str | None = None, template: str | None = None,
                      parameters: Mapping[str, Any] | None = None, messages: Sequence[Mapping[str, str]] = (),
                      license: str | None = None) -> str:
    """A Modelfile FROM stored model `base` saying what a variant of it changes (the REPL's
    /save, the server's /api/create): SYSTEM, TEMPLATE, a PARAMETER per value (stop's list one
    line each), a MESSAGE per message, LICENSE."""
    lines = [f"FROM {base}"]
    lines += [f"{key} {_quote(text)}" for key, text in (("SYSTEM", system), ("TEMPLATE", template)) if text]
    for key, value in (parameters or {}).items():
        for one in value if isinstance(value, (list, tuple)) else [value]:
            lines.append(f"PARAMETER {key} {_quote(one) if isinstance(one, str) else _format_param(one)}")
    lines += [f"MESSAGE {m['role']} {_quote(m['content'])}" for m in messages]
    if license:
        lines.append(f"LICENSE {_quote(license)}")
    return "\n".join(lines) + "\n"


def _recipe_lines(recipe: Recipe, base: Recipe | None) -> list[str]:
    """The lines stating `recipe`; with a base, only what differs from it (tags inherit the rest)."""
    if base is not None:
        for f in fields(Recipe):
            mine, theirs = getattr(recipe, f.name), getattr(base, f.name)
            if f.name not in ("name", "tag", "parameters", "messages") and mine is None and theirs is not None:
                raise ValueError(f"tag {recipe.tag} unsets {f.name}; a Modelfile tag can only override")
        if any(k not in recipe.parameters for k in base.parameters):
            raise ValueError(f"tag {recipe.tag} drops a parameter of latest; a Modelfile tag can only override")

    def changed(attr: str) -> bool:
        value = getattr(recipe, attr)
        return value is not None and (base is None or value != getattr(base, attr))

    src = recipe.source
    out = []
    if changed("description"):
        out.append(f"DESCRIPTION {_quote(recipe.description)}")
    if changed("source"):
        out.append(f"FROM {_word(src.uri()) if src.scheme == 'local' else src.uri()}")
    if changed("family"):
        out.append(f"FAMILY {recipe.family}")
    if base is None or recipe.dtype != base.dtype:
        out.append(f"DTYPE {recipe.dtype}")
    if changed("template"):
        t = recipe.template
        out.append(f"TEMPLATE {t if t == TEMPLATE_FROM_CHECKPOINT else _quote(t)}")
    if changed("system"):
        out.append(f"SYSTEM {_quote(recipe.system)}")
    for key, value in recipe.parameters.items():
        if base is not None and base.parameters.get(key) == value:
            continue
        if key == "stop":
            out += [f"PARAMETER stop {_quote(s)}" for s in value]
        else:
            out.append(f"PARAMETER {key} {_format_param(value)}")
    if recipe.messages and (base is None or recipe.messages != base.messages):
        out += [f"MESSAGE {role} {_quote(content)}" for role, content in recipe.messages]
    if changed("license"):
        out.append(f"LICENSE {_word(recipe.license)}")
    if changed("context_length"):
        out.append(f"CONTEXT {recipe.context_length}")
    return out


def _jinja_template(template: str) -> str:
    """A TEMPLATE as ft renders it: Jinja as written, an Ollama (Go) template translated
    (ftpull/go_template.py). It must compile here, not fail at every `ft run` later."""
    from runtime.text.chat_template import ChatTemplateError, compile_template

    from .go_template import GoTemplateError, looks_like_go, to_jinja

    go = looks_like_go(template)
    try:
        jinja = to_jinja(template) if go else template
        compile_template(jinja)
    except (GoTemplateError, ChatTemplateError) as e:
        hint = ("; this is an Ollama (Go) template, which ft translates to the Jinja it renders (as a "
                "checkpoint's chat_template is) where it can: leave TEMPLATE out, or write `TEMPLATE checkpoint`, "
                "to use the model's own, or write it in Jinja ({{ range .Messages }} is {% for message in messages %}, "
                "{{ .Role }} and {{ .Content }} are {{ message.role }} and {{ message.content }}, "
                "{{ if eq .Role \"user\" }} is {% if message.role == 'user' %}, {{ end }} is {% endif %} or "
                "{% endfor %}, and the reply is asked for under {% if add_generation_prompt %})") if go else ""
        raise ValueError(f"TEMPLATE: {e}{hint}") from None
    return jinja
