"""The model-name grammar.

A name is ``[host/][namespace/]model[:tag]``; missing parts default to host ``ft.local``,
namespace ``library`` and tag ``latest``. Every part is lower-cased, the tag too: names are
case-insensitive, as Ollama's are (``ft cp tiny A:TagX`` then ``ft show a:tagx`` is one model). Every part becomes one path component under ``manifests/``, so the grammar is also the
store's defence against path traversal: a part can never be empty, start with a dot, contain
``..``, a slash, a backslash or a NUL byte. A name is ASCII, as Ollama's grammar is, and that is
checked on the text as given, before any case folding: a look-alike such as the Kelvin sign
(U+212A, which ``lower()`` turns into an ASCII ``k``) or a control character is refused, never
folded into another model's name.

    >>> str(parse_name("qwen3:30b"))
    'ft.local/library/qwen3:30b'
    >>> parse_name("ft.local/library/qwen3").display
    'qwen3:latest'
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass

from .errors import InvalidNameError

DEFAULT_HOST = "ft.local"
DEFAULT_NAMESPACE = "library"
DEFAULT_TAG = "latest"

MAX_NAME_CHARS = 512
ACCEPTED_FORM = (
    "expected [host/][namespace/]model[:tag], e.g. 'qwen3:30b', 'myteam/glm-5.2' or "
    "'ft.local/library/qwen3:latest'"
)

_COMPONENT_RE = re.compile(r"[a-z0-9][a-z0-9._-]{0,127}")
_TAG_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,127}")
_HOST_RE = re.compile(r"[a-z0-9][a-z0-9.-]{0,252}(:[0-9]{1,5})?")

_RULES = {
    "host": "letters, digits, '.' and '-', optionally ':port'",
    "namespace": "1-128 of a-z 0-9 . _ - starting with a letter or digit",
    "model": "1-128 of a-z 0-9 . _ - starting with a letter or digit",
    "tag": "1-128 of A-Z a-z 0-9 . _ - starting with a letter, digit or '_'",
}


def _bad(text: str, part: str, value: str, why: str) -> InvalidNameError:
    return InvalidNameError(
        f"invalid model name {text!r}: {part} {value!r} {why} ({part}: {_RULES.get(part, '')}); "
        f"{ACCEPTED_FORM}"
    )


def _bad_character(text: str, ascii_only: bool = True) -> str | None:
    """What makes `text` no name before any folding: a control or (`ascii_only`) a non-ASCII
    character; None when it has neither."""
    for ch in text:
        code = ord(ch)
        if code == 0:
            return "contains a NUL byte"
        if code < 0x20 or 0x7F <= code < 0xA0:
            return f"contains the control character U+{code:04X}"
        if code > 0x7F and ascii_only:
            what = unicodedata.name(ch, "")
            return (f"contains the non-ASCII character {ch!r} (U+{code:04X}{' ' + what if what else ''}); names are "
                    "ASCII only: retype it in plain ASCII")
    return None


def refuse_control_characters(text: str) -> None:
    """Raise `InvalidNameError` if `text` holds a control character (NUL included): what a model
    name, a path or an address to pull never has (a path may be non-ASCII, a name may not)."""
    why = _bad_character(text, ascii_only=False)
    if why:
        raise InvalidNameError(f"invalid model name {text!r}: {why}; {ACCEPTED_FORM}")


def _check_part(text: str, part: str, value: str) -> None:
    """Raise InvalidNameError unless `value` is a valid `part` (host, namespace, model, tag)."""
    if value == "":
        raise _bad(text, part, value, "is empty")
    if value.startswith("."):
        raise _bad(text, part, value, "starts with '.'")
    if ".." in value:
        raise _bad(text, part, value, "contains '..'")
    pattern = {"host": _HOST_RE, "tag": _TAG_RE}.get(part, _COMPONENT_RE)
    if not pattern.fullmatch(value):
        raise _bad(text, part, value, "has a character or length that is not allowed")


@dataclass(frozen=True)
class ModelName:
    """A fully qualified model name; construct with `parse_name` (the constructor validates too)."""

    host: str
    namespace: str
    model: str
    tag: str

    def __post_init__(self) -> None:
        text = f"{self.host}/{self.namespace}/{self.model}:{self.tag}"
        for part in ("host", "namespace", "model", "tag"):
            value = getattr(self, part)
            if not isinstance(value, str):
                raise InvalidNameError(f"invalid model name: {part} must be a string, got {value!r}")
            _check_part(text, part, value)

    def __str__(self) -> str:
        return f"{self.host}/{self.namespace}/{self.model}:{self.tag}"

    @property
    def display(self) -> str:
        """The short form users type: ``model:tag``, ``ns/model:tag`` or the full name."""
        if self.host != DEFAULT_HOST:
            return str(self)
        if self.namespace != DEFAULT_NAMESPACE:
            return f"{self.namespace}/{self.model}:{self.tag}"
        return f"{self.model}:{self.tag}"

    @property
    def parts(self) -> tuple[str, str, str, str]:
        """The path components of the manifest below ``manifests/``: host, namespace, model, tag."""
        return (self.host, self.namespace, self.model, self.tag)


def parse_name(text: str) -> ModelName:
    """Parse ``[host/][namespace/]model[:tag]`` into a `ModelName`, filling in the defaults.

    Raises `InvalidNameError` naming the bad part for anything outside the grammar.
    """
    if not isinstance(text, str):
        raise InvalidNameError(f"invalid model name {text!r}: not a string; {ACCEPTED_FORM}")
    if text == "" or text.strip() == "":
        raise InvalidNameError(f"invalid model name {text!r}: empty; {ACCEPTED_FORM}")
    if len(text) > MAX_NAME_CHARS:
        raise InvalidNameError(
            f"invalid model name {text[:40]!r}...: longer than {MAX_NAME_CHARS} characters; {ACCEPTED_FORM}"
        )
    why = _bad_character(text) or ("contains a backslash" if "\\" in text else None)
    if why:  # on the text as given: lower() below must never fold a look-alike into ASCII
        raise InvalidNameError(f"invalid model name {text!r}: {why}; {ACCEPTED_FORM}")
    if text.startswith("/"):
        raise InvalidNameError(f"invalid model name {text!r}: looks like an absolute path; {ACCEPTED_FORM}")
    if any(ch.isspace() for ch in text):
        raise InvalidNameError(f"invalid model name {text!r}: contains whitespace; {ACCEPTED_FORM}")

    pieces = text.split("/")
    if len(pieces) > 3:
        raise InvalidNameError(
            f"invalid model name {text!r}: {len(pieces)} '/'-separated parts, at most 3 allowed; "
            f"{ACCEPTED_FORM}"
        )
    last = pieces[-1]
    model, sep, tag = last.partition(":")
    if not sep:
        tag = DEFAULT_TAG
    elif ":" in tag:
        raise _bad(text, "tag", tag, "contains ':'")
    elif tag == "":
        raise _bad(text, "tag", tag, "is empty (drop the ':' to get 'latest')")
    prefix = pieces[:-1]
    host = prefix[0] if len(prefix) == 2 else DEFAULT_HOST
    namespace = prefix[-1] if prefix else DEFAULT_NAMESPACE

    host, namespace, model, tag = host.lower(), namespace.lower(), model.lower(), tag.lower()
    for part, value in (("host", host), ("namespace", namespace), ("model", model), ("tag", tag)):
        _check_part(text, part, value)
    return ModelName(host=host, namespace=namespace, model=model, tag=tag)


def as_name(name: ModelName | str) -> ModelName:
    """Return `name` as a `ModelName`, parsing it when it is a string."""
    return name if isinstance(name, ModelName) else parse_name(name)
