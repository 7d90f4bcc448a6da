"""Errors raised by the FTW format code. Each names the file or tensor at fault and the fix."""

from __future__ import annotations


class FTWError(Exception):
    """Base class of every error ftw/ raises on bad input."""


class UnsupportedVersionError(FTWError):
    """The index declares a format version this reader does not know."""


class CorruptIndexError(FTWError):
    """The index JSON is malformed, inconsistent, or points outside its shards."""


class CorruptShardError(FTWError):
    """A shard is missing, truncated, or its sha256 does not match the index."""


class WriterStateError(FTWError):
    """The writer was driven out of order (e.g. a dense tensor while a bank is open)."""


class SourceError(FTWError):
    """A source checkpoint (safetensors, config.json) is malformed or incomplete."""


class UnsupportedArchitectureError(FTWError):
    """The checkpoint's architecture has no converter."""
