"""Where a recipe's weights come from: `hf://org/repo[@rev]`, `gguf://org/repo/file.gguf[@rev]`,
`builtin://name`, or a local path. Parsed and validated as the Hub does; never opened here."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Literal

from registry import InvalidNameError, parse_name

SourceScheme = Literal["hf", "gguf", "builtin", "local"]

_NAME_PART = r"[A-Za-z0-9][A-Za-z0-9._-]*"
_REPO_ID = re.compile(rf"{_NAME_PART}/{_NAME_PART}")
_REVISION = re.compile(r"[A-Za-z0-9._-]+(?:/[A-Za-z0-9._-]+)*")
_GGUF_SEGMENT = re.compile(r"[A-Za-z0-9._+=-]+")
_BUILTIN = re.compile(r"[a-z0-9][a-z0-9._-]*")
URI = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*)://(.*)", re.S)


@dataclass(frozen=True)
class Source:
    """Where weights come from. hf/gguf: repo_id `org/name`, optional revision; gguf: path is the
    .gguf file inside the repo; builtin: path is the builtin model's name; local: path is an
    absolute directory path."""

    scheme: SourceScheme
    repo_id: str | None = None
    revision: str | None = None
    path: str | None = None
    # local: the text as written where it also reads as a stored model's name (Ollama's `FROM
    # MODEL`); `ft create` takes that model when no such directory exists (pull.create)
    model_name: str | None = field(default=None, compare=False)

    def uri(self) -> str:
        """The canonical text; parse_source(uri) gives back an equal Source."""
        at = f"@{self.revision}" if self.revision else ""
        if self.scheme == "hf":
            return f"hf://{self.repo_id}{at}"
        if self.scheme == "gguf":
            return f"gguf://{self.repo_id}/{self.path}{at}"
        if self.scheme == "builtin":
            return f"builtin://{self.path}"
        return str(self.path)

    def __str__(self) -> str:
        return self.uri()


def parse_source(text: str, base_dir: str | os.PathLike[str] | None = None) -> Source:
    """Parse `hf://org/repo[@rev]`, `gguf://org/repo/file.gguf[@rev]`, `builtin://name` or a local
    directory path (relative paths resolve against base_dir, else the working directory).
    Raises ValueError with the reason; the parser turns it into a ModelfileError."""
    if not text or text != text.strip() or any(ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0 for c in text):
        raise ValueError(f"source {text!r} is empty or contains whitespace or control characters")
    m = URI.fullmatch(text)
    if not m:
        path = os.path.expanduser(text)
        if not os.path.isabs(path):
            path = os.path.join(os.fspath(base_dir) if base_dir is not None else os.getcwd(), path)
        return Source("local", path=os.path.normpath(path), model_name=text if _reads_as_model_name(text) else None)
    scheme, rest = m.group(1).lower(), m.group(2)
    if scheme == "builtin":
        if not _BUILTIN.fullmatch(rest):
            raise ValueError(f"builtin model name {rest!r} must match [a-z0-9][a-z0-9._-]*")
        return Source("builtin", path=rest)
    if scheme not in ("hf", "gguf"):
        raise ValueError(f"unknown source scheme {scheme + '://'!r} (expected hf://, gguf://, builtin:// or a local path)")
    body, sep, revision = rest.partition("@")
    if sep and not _valid_revision(revision):
        raise ValueError(f"revision {revision!r} must be a branch, tag or commit ([A-Za-z0-9._-], '/'-separated)")
    parts = body.split("/")
    repo_id = "/".join(parts[:2])
    _check_repo_id(repo_id)
    if scheme == "hf":
        if len(parts) != 2:
            raise ValueError(f"hf source {text!r} must be hf://org/name[@revision]")
        return Source("hf", repo_id=repo_id, revision=revision or None)
    file_parts = parts[2:]
    if not file_parts or not all(_GGUF_SEGMENT.fullmatch(p) and p not in (".", "..") for p in file_parts):
        raise ValueError(f"gguf source {text!r} must be gguf://org/name/path/file.gguf[@revision]")
    if not file_parts[-1].lower().endswith(".gguf"):
        raise ValueError(f"gguf source {text!r} must name a .gguf file")
    return Source("gguf", repo_id=repo_id, revision=revision or None, path="/".join(file_parts))


def _reads_as_model_name(text: str) -> bool:
    """Whether a FROM without a scheme may name a stored model: a valid name that does not start
    as a path does (`./`, `../`, `/`, `~`)."""
    if text.startswith((".", "/", "~")) or "\\" in text:
        return False
    try:
        parse_name(text)
    except InvalidNameError:
        return False
    return True


def _check_repo_id(repo_id: str) -> None:
    # The Hub's own rules: org/name, each part [A-Za-z0-9][A-Za-z0-9._-]*, no '..' or '--', <= 96 chars.
    if not _REPO_ID.fullmatch(repo_id) or ".." in repo_id or "--" in repo_id or len(repo_id) > 96 \
            or repo_id.endswith((".", "-")) or repo_id.endswith(".git"):
        raise ValueError(f"repository id {repo_id!r} is not a valid Hugging Face repo id (org/name)")


def _valid_revision(revision: str) -> bool:
    return bool(_REVISION.fullmatch(revision)) and ".." not in revision and len(revision) <= 255
