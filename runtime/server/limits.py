"""Limits on what a request body may be, checked on the raw bytes before anything parses them.

MAX_BODY_BYTES: a request body larger than this gets a 413. A million-token conversation is a
few MiB of JSON; the limit is far past what a client of a local model sends.

MAX_JSON_DEPTH: a body whose arrays and objects nest deeper than this gets a 400. Python's
json (and every parser and template after it) recurses once per level, so a body of 10,000
``[`` raised RecursionError, a 500; a real request nests a handful of levels, a tool's JSON
schema maybe ten more.

`json_depth` counts the nesting in one linear scan that recurses nowhere: strings cut out by one
regular expression, everything but brackets deleted, then the running sum of +1 and -1 (numpy:
a 32 MiB body of brackets in tens of milliseconds). Both limits are documented in the README
beside the server's other limits.
"""

from __future__ import annotations

import json
import re

import numpy as np

MAX_BODY_BYTES = 32 << 20
MAX_JSON_DEPTH = 64

_STRING_RE = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_SIGNS = bytes.maketrans(b"[{]}", b"\x01\x01\xff\xff")  # read as signed bytes: +1 open, -1 close


def json_depth(data: bytes | str) -> int:
    """How deep the arrays and objects of the JSON text `data` nest (0 for a scalar), without
    parsing it; malformed text gets a number too, which the parser then refuses."""
    if isinstance(data, str):
        data = data.encode("utf-8", "surrogatepass")
    else:
        try:  # json.loads reads UTF-16 and UTF-32 too; the scan below needs ASCII brackets and quotes
            encoding = json.detect_encoding(data)
            if encoding != "utf-8":
                data = data.decode(encoding).encode("utf-8", "surrogatepass")
        except (UnicodeDecodeError, LookupError):
            return 0  # not text: the parser refuses it
    structure = _STRING_RE.sub(b"", data).translate(_SIGNS, _NOT_BRACKETS)  # what is left: +1 and -1 bytes
    if not structure:
        return 0
    return max(0, int(np.cumsum(np.frombuffer(structure, dtype=np.int8), dtype=np.int32).max()))


def too_deep(data: bytes | str) -> str | None:
    """Why `data` is refused for its nesting (None: within MAX_JSON_DEPTH)."""
    depth = json_depth(data)
    if depth <= MAX_JSON_DEPTH:
        return None
    return (f"the JSON nests {depth} levels deep, more than the {MAX_JSON_DEPTH} ft accepts; "
            "send arrays and objects nested less deeply")


def too_large(size_bytes: int | None = None) -> str:
    """Why a body of `size_bytes` (None: unknown, past the limit) is refused."""
    size = "" if size_bytes is None else f" ({size_bytes} bytes)"
    return (f"the request body{size} is larger than the {MAX_BODY_BYTES >> 20} MiB ft accepts; "
            "send a shorter conversation or prompt")
