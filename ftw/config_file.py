"""A checkpoint's config.json, read defensively: torch-free, so the CLI and the Hub client can
read configs without importing the converter."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .errors import SourceError

MAX_CONFIG_BYTES = 4 << 20


def load_config(directory: Path) -> dict[str, Any]:
    """The checkpoint's config.json, parsed defensively."""
    path = Path(directory) / "config.json"
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise SourceError(f"{path} is missing: a Hugging Face checkpoint needs its config.json") from None
    if len(raw) > MAX_CONFIG_BYTES:
        raise SourceError(f"{path} is {len(raw)} bytes, too large for a model config")
    try:
        config = json.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise SourceError(f"{path} is not valid JSON; re-download the checkpoint") from None
    if not isinstance(config, dict):
        raise SourceError(f"{path} is not a JSON object")
    return config
