"""The text layer's errors a user's request causes, torch-free (the CLI catches them before it
imports anything heavy)."""

from __future__ import annotations

from typing import Any


class InvalidParameterError(ValueError):
    """A sampling option out of range or of the wrong type; the message names it and its range."""

    def __init__(self, name: str, value: Any, allowed: str) -> None:
        super().__init__(f"invalid {name}={value!r}: {allowed}")
        self.name = name
        self.value = value
        self.allowed = allowed
