"""Ollama's Go chat templates, translated to the Jinja that ft renders (runtime/text/chat_template.py).

A Modelfile written for Ollama carries a Go `text/template` TEMPLATE. ft renders Jinja, as a
checkpoint's chat_template is, so such a template is translated once, when the Modelfile is read,
to Jinja that renders the same text for the same conversation, as Ollama's template.Execute does:

- The values a template sees are Ollama's. `.Messages` are the conversation with consecutive
  messages of one role merged ("\\n\\n" between them), `.System` every system message's content
  joined the same way, `.Tools` the request's tools; a message's fields are its keys in
  CamelCase (`.Role`, `.Content`, `.ToolCalls`, `.Function.Arguments`).
- A template that never names `.Messages` is a legacy one (`.System`, `.Prompt`, `.Response`).
  Ollama renders it once for each exchange, a user prompt with the system message before it and
  the reply after it, and the last time only as far as `{{ .Response }}`, where the model's reply
  goes. The translation does the same with two Jinja macros.
- The Go subset the translation knows: text and `{{- -}}` trimming, comments, fields of `.` and
  `$`, variables (`$x := ...`, `range $i, $m := ...`), `if` / `else if` / `else`, `range` (with
  `else`), `with`, parentheses, string, number and boolean literals, and the functions eq, ne,
  lt, le, gt, ge, and, or, not, len, index, slice and Ollama's json. Anything else (printf, a
  pipeline `|`, reassigning a variable, another Ollama function) is refused by name, with the
  advice to write the template in Jinja.
- A value printed is printed as Go prints it where the two agree: strings as they are, other
  values (a tool's function, arguments) as compact JSON, as Ollama's types print themselves.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_ACTION = re.compile(r"\{\{(-\s)?(.*?)(\s-)?\}\}", re.DOTALL)
_TOKEN = re.compile(r"""\s*(?:(?P<str>"(?:[^"\\]|\\.)*")|(?P<raw>`[^`]*`)|(?P<num>-?\d+(?:\.\d+)?)"""
                    r"""|(?P<var>\$[A-Za-z_]\w*)(?P<vfields>(?:\.[A-Za-z_]\w*)*)|(?P<field>(?:\.[A-Za-z_]\w*)+)"""
                    r"""|(?P<dollar>\$)(?P<dfields>(?:\.[A-Za-z_]\w*)*)|(?P<dot>\.)|(?P<word>[A-Za-z_]\w*)"""
                    r"""|(?P<punct>:=|=|\(|\)|\||,))""")
ROOT_FIELDS = ("System", "Messages", "Tools", "Prompt", "Response", "Think", "Suffix")
COMPARISONS = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}
TEXT_OPENERS = ("{{", "{%", "{#")


class GoTemplateError(ValueError):
    """A Go template this translation cannot render as Ollama would."""


def looks_like_go(template: str) -> bool:
    """Whether `template` is written as Ollama's Go templates are: an action that names a field
    of `.` or `$` (`{{ .System }}`, `{{ eq .Role "user" }}`; Jinja's are `message.role`), or
    that is a Go keyword or comment (`{{ end }}`, `{{ range ...`, `{{/* ... */}}`)."""
    for m in _ACTION.finditer(template):
        body = m.group(2).strip()
        if re.search(r"(^|[\s(])(\.[A-Za-z_]|\$)", body) or re.match(r"(end|else)\b|range\s|with\s|/\*", body):
            return True
    return False


def to_jinja(template: str) -> str:
    """The Jinja for Ollama Go template `template`; GoTemplateError names what it cannot translate."""
    items = _lex(template)
    legacy = not any(kind == "action" and re.search(r"(^|[\s(.$])\.?Messages\b", body) for kind, body in items)
    header = "{#- translated from an Ollama Go template by ft (ftpull/go_template.py) -#}\n"
    if not legacy:  # (`{{ '' }}` last: Jinja drops a template's final newline, Go keeps it)
        return header + _MESSAGES_PRELUDE + _Translator(items).translate() + "{{ '' }}"
    whole, upto_response = _Translator(items).translate(), _Translator(items, cut_at_response=True).translate()
    # (`+`: the bodies' own whitespace kept at their ends; ft renders with trim_blocks and lstrip_blocks)
    return (header + "{%- macro ft_turn(System, Prompt, Response) +%}" + whole + "{%+ endmacro -%}"
            "{%- macro ft_last(System, Prompt, Response) +%}" + upto_response + "{%+ endmacro -%}" + _LEGACY_DRIVER)


# one step of Ollama's collate(), message m into ft.messages: merged into the last one where of its role
_MERGE_INTO_FT_MESSAGES = (
    "{%- if ft.messages and ft.messages[-1].role == m.role -%}"
    "{%- set ft.messages = ft.messages[:-1] + [dict(ft.messages[-1], content=(ft.messages[-1].content or '') "
    "+ '\\n\\n' + (m.content or ''))] -%}"
    "{%- else -%}{%- set ft.messages = ft.messages + [m] -%}{%- endif -%}"
)
# Ollama's collate(): consecutive messages of one role merged, every system message's content joined
_MESSAGES_PRELUDE = (
    "{%- set ft = namespace(system=[], messages=[]) -%}"
    "{%- for m in messages -%}"
    "{%- if m.role == 'system' -%}{%- set ft.system = ft.system + [m.content or ''] -%}{%- endif -%}"
    + _MERGE_INTO_FT_MESSAGES +
    "{%- endfor -%}"
    "{%- set System = ft.system | join('\\n\\n') -%}{%- set Messages = ft.messages -%}{%- set Tools = tools or [] +%}"
)
# Ollama's legacy loop: an exchange rendered when the next one starts, the last one cut at .Response
_LEGACY_DRIVER = (
    "{%- set ft = namespace(system='', prompt='', response='', messages=[]) -%}"
    "{%- for m in messages -%}"
    + _MERGE_INTO_FT_MESSAGES +
    "{%- endfor -%}"
    "{%- for m in ft.messages -%}"
    "{%- if m.role == 'system' -%}"
    "{%- if ft.prompt or ft.response -%}{{ ft_turn(ft.system, ft.prompt, ft.response) }}"
    "{%- set ft.prompt = '' -%}{%- set ft.response = '' -%}{%- endif -%}"
    "{%- set ft.system = m.content or '' -%}"
    "{%- elif m.role == 'user' -%}"
    "{%- if ft.response -%}{{ ft_turn(ft.system, ft.prompt, ft.response) }}"
    "{%- set ft.system = '' -%}{%- set ft.prompt = '' -%}{%- set ft.response = '' -%}{%- endif -%}"
    "{%- set ft.prompt = m.content or '' -%}"
    "{%- elif m.role == 'assistant' -%}{%- set ft.response = m.content or '' -%}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{{ ft_last(ft.system, ft.prompt, ft.response) }}"
)


def _lex(template: str) -> list[tuple[str, str]]:
    """[("text", s) | ("action", body)], Go's trim markers applied to the text beside them."""
    items: list[tuple[str, str]] = []
    at, trim_next = 0, False
    for m in _ACTION.finditer(template):
        text = template[at : m.start()]
        if trim_next:
            text = text.lstrip(" \t\r\n")
        if m.group(1):
            text = text.rstrip(" \t\r\n")
        if text:
            items.append(("text", text))
        body = m.group(2).strip()
        if not (body.startswith("/*") and body.endswith("*/")):  # a comment renders nothing
            items.append(("action", body))
        at, trim_next = m.end(), bool(m.group(3))
    text = template[at:]
    if trim_next:
        text = text.lstrip(" \t\r\n")
    if "{{" in text:
        raise GoTemplateError("a `{{` without its `}}`")
    if text:
        items.append(("text", text))
    return items


@dataclass
class _Block:
    kind: str  # "if" | "range" | "with"
    dots: int  # how many dot rebinds the block pushed


@dataclass
class _Translator:
    items: list[tuple[str, str]]
    cut_at_response: bool = False
    out: list[str] = field(default_factory=list)
    blocks: list[_Block] = field(default_factory=list)
    dots: list[str] = field(default_factory=lambda: [""])  # "" is the root: its fields are names
    loops: int = 0

    def translate(self) -> str:
        for kind, body in self.items:
            if kind == "text":
                self.out.append("{{ " + _jinja_string(body) + " }}" if any(o in body for o in TEXT_OPENERS) else body)
                continue
            if self._action(body):
                break  # the cut: what follows .Response is not rendered
        else:
            if self.blocks:
                raise GoTemplateError(f"a `{{{{ {self.blocks[-1].kind} }}}}` without its `{{{{ end }}}}`")
        while self.blocks:  # (the cut closes what is open)
            self._end()
        return "".join(self.out)

    def _tag(self, text: str) -> None:
        # `+`: no trim_blocks or lstrip_blocks (ft renders as transformers does, with both): Go keeps the text
        self.out.append("{%+ " + text + " +%}")

    def _action(self, body: str) -> bool:
        """Translate one action; True where it is the cut."""
        words = body.split(None, 1)
        head, rest = (words[0], words[1] if len(words) > 1 else "") if words else ("", "")
        if head == "if":
            self._tag(f"if {self._expr(rest)}")
            self.blocks.append(_Block("if", 0))
        elif head == "else" and rest.startswith("if "):
            self._need_block("if", "else if")
            self._tag(f"elif {self._expr(rest[3:])}")
        elif head == "else" and not rest:
            if not self.blocks:
                raise GoTemplateError("an `{{ else }}` outside any block")
            block = self.blocks[-1]
            if block.dots:  # a range's or with's else: `.` is the outer one again
                del self.dots[len(self.dots) - block.dots:]
                block.dots = 0
            self._tag("else")
        elif head == "end" and not rest:
            if not self.blocks:
                raise GoTemplateError("an `{{ end }}` without its block")
            self._end()
        elif head == "range":
            self._range(rest)
        elif head == "with":
            expr = self._expr(rest)
            self._tag(f"if {expr}")
            self.dots.append(f"({expr})")
            self.blocks.append(_Block("with", 1))
        elif head in ("define", "template", "block", "break", "continue"):
            raise GoTemplateError(f"`{{{{ {head} }}}}` has no translation here")
        else:
            m = re.fullmatch(r"(\$[A-Za-z_]\w*)\s*(:?=)\s*(.+)", body, re.DOTALL)
            if m is not None:
                if m.group(2) == "=":
                    raise GoTemplateError(f"reassigning {m.group(1)} (`=`) has no translation here")
                self._tag(f"set {_variable(m.group(1))} = {self._expr(m.group(3))}")
                return False
            expr = self._expr(body)
            self.out.append("{{ " + _printed(expr) + " }}")
            return self.cut_at_response and len(self.dots) == 1 and re.search(r"\bResponse\b", expr) is not None
        return False

    def _range(self, rest: str) -> None:
        m = re.fullmatch(r"(?:(\$[A-Za-z_]\w*)\s*(?:,\s*(\$[A-Za-z_]\w*))?\s*:=\s*)?(.+)", rest, re.DOTALL)
        if m is None:
            raise GoTemplateError(f"`{{{{ range {rest} }}}}` has no translation here")
        self.loops += 1
        item = f"ft_item{self.loops}"
        self._tag(f"for {item} in {self._expr(m.group(3))}")
        index, value = (m.group(1), m.group(2)) if m.group(2) else (None, m.group(1))
        if index:
            self._tag(f"set {_variable(index)} = loop.index0")
        if value:
            self._tag(f"set {_variable(value)} = {item}")
        self.dots.append(item)
        self.blocks.append(_Block("range", 1))

    def _need_block(self, kind: str, what: str) -> None:
        if not self.blocks or self.blocks[-1].kind not in (kind, "with"):
            raise GoTemplateError(f"an `{{{{ {what} }}}}` outside an `{{{{ {kind} }}}}`")

    def _end(self) -> None:
        block = self.blocks.pop()
        del self.dots[len(self.dots) - block.dots:]
        self._tag("endfor" if block.kind == "range" else "endif")

    def _expr(self, source: str) -> str:
        tokens = _tokens(source)
        expr, at = self._command(tokens, 0)
        if at != len(tokens):
            what = "a pipeline (`|`)" if tokens[at] == ("punct", "|") else f"{tokens[at][1]!r}"
            raise GoTemplateError(f"`{source}`: {what} has no translation here")
        return expr

    def _command(self, tokens: list[tuple[str, str]], at: int) -> tuple[str, int]:
        """One command: an operand, or a function applied to the operands after it (up to `)`)."""
        kind, text = tokens[at]
        if kind == "word" and text not in ("true", "false", "nil"):
            args = []
            at += 1
            while at < len(tokens) and tokens[at] != ("punct", ")"):
                if tokens[at][0] == "punct" and tokens[at][1] != "(":
                    raise GoTemplateError(f"`{text} ...`: a {tokens[at][1]!r} has no translation here")
                arg, at = self._operand(tokens, at)
                args.append(arg)
            return _call(text, args), at
        return self._operand(tokens, at)

    def _operand(self, tokens: list[tuple[str, str]], at: int) -> tuple[str, int]:
        kind, text = tokens[at]
        if kind == "punct" and text == "(":
            expr, at = self._command(tokens, at + 1)
            if at >= len(tokens) or tokens[at] != ("punct", ")"):
                raise GoTemplateError("a `(` without its `)`")
            return f"({expr})", at + 1
        if kind == "punct":
            raise GoTemplateError(f"a {text!r} has no translation here (pipelines and the like: write Jinja)")
        if kind == "word":
            if text in ("true", "false"):
                return text, at + 1
            if text == "nil":
                return "none", at + 1
            return f"({_call(text, [])})", at + 1
        if kind in ("str", "raw", "num"):
            return text, at + 1
        if kind == "dot" and not self.dots[-1] or kind == "dollar" and not text:
            raise GoTemplateError("the whole of `.` or `$` at the top has no translation here: name its field")
        if kind == "dot":
            return self.dots[-1], at + 1
        if kind == "dollar":
            return _fields("", text), at + 1
        if kind == "var":
            name, _, chain = text.partition(".")
            return _fields(_variable(name), "." + chain if chain else ""), at + 1
        return _fields(self.dots[-1], text), at + 1


def _tokens(source: str) -> list[tuple[str, str]]:
    tokens, at = [], 0
    source = source.rstrip()
    while at < len(source):
        m = _TOKEN.match(source, at)
        if m is None or m.end() == at:
            raise GoTemplateError(f"`{source}`: cannot read it from {source[at:at + 20]!r}")
        at = m.end()
        kind = m.lastgroup
        if kind in ("vfields", "dfields"):
            kind = "var" if kind == "vfields" else "dollar"
        if kind == "str":
            tokens.append(("str", _jinja_string(_go_string(m.group("str")))))
        elif kind == "raw":
            tokens.append(("str", _jinja_string(m.group("raw")[1:-1])))
        elif kind == "var":
            tokens.append(("var", m.group("var") + (m.group("vfields") or "")))
        elif kind == "dollar":
            tokens.append(("dollar", m.group("dfields") or ""))
        else:
            tokens.append((kind, m.group(kind)))  # type: ignore[arg-type]
    return tokens


def _go_string(literal: str) -> str:
    escapes = {"n": "\n", "t": "\t", "r": "\r", '"': '"', "\\": "\\"}

    def one(m: re.Match) -> str:
        if m.group(1) not in escapes:
            raise GoTemplateError(f"the escape \\{m.group(1)} in {literal} has no translation here")
        return escapes[m.group(1)]

    return re.sub(r"\\(.)", one, literal[1:-1])


def _jinja_string(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'").replace("\n", "\\n").replace("\r", "\\r") + "'"


def _variable(name: str) -> str:
    return "ft_" + name[1:]


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def _fields(base: str, chain: str) -> str:
    """`base` (a Jinja expression; "" the root) followed by Go field chain `chain` (".A.B")."""
    names = [n for n in chain.split(".") if n]
    if not names:
        return base
    if not base:  # the root's fields are the names the prelude sets
        if names[0] not in ROOT_FIELDS:
            raise GoTemplateError(f".{names[0]} is not a value Ollama gives a template (it gives "
                                  f"{', '.join('.' + f for f in ROOT_FIELDS)})")
        base, names = names[0], names[1:]
    return base + "".join(f".{_snake(n)}" for n in names)


def _call(name: str, args: list[str]) -> str:
    if name in COMPARISONS:
        if len(args) < 2 or (name != "eq" and len(args) != 2):
            raise GoTemplateError(f"`{name}` takes two operands here, got {len(args)}")
        if name == "eq" and len(args) > 2:
            return "(" + " or ".join(f"{args[0]} == {a}" for a in args[1:]) + ")"
        return f"({args[0]} {COMPARISONS[name]} {args[1]})"
    if name in ("and", "or") and len(args) >= 2:
        return "(" + f" {name} ".join(args) + ")"
    if name == "not" and len(args) == 1:
        return f"(not {args[0]})"
    if name == "len" and len(args) == 1:
        return f"({args[0]} | length)"
    if name == "index" and len(args) >= 2:
        return args[0] + "".join(f"[{a}]" for a in args[1:])
    if name == "slice" and len(args) in (2, 3):
        return f"{args[0]}[{args[1]}:{args[2] if len(args) == 3 else ''}]"
    if name == "json" and len(args) == 1:
        return f"({args[0]} | tojson(separators=(',', ':')))"
    raise GoTemplateError(f"the function `{name}` (with {len(args)} operands) has no translation here")


def _printed(expr: str) -> str:
    """How Go prints `expr`: a string as it is, nothing for a value absent, other values as JSON."""
    if expr.startswith("(") and "tojson" in expr:
        return expr
    return (f"'' if {expr} is undefined or {expr} is none else {expr} if {expr} is string "
            f"else {expr} | tojson(separators=(',', ':'))")
