"""What one sequence carries between forward passes, and a recurrent model's saved copy of it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class DecodeState:
    """Everything one sequence carries between forward calls: per-layer caches and its length."""

    max_tokens: int
    caches: list[Any]
    length: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class StateCheckpoint:
    """A state's recurrent caches as they were at `length` tokens (host copies, by layer index);
    its positional caches need nothing saved: `set_length` takes them back."""

    length: int
    caches: dict[int, Any]
