"""Typed errors of the registry.

Every error a user, the disk or another process can cause is a `RegistryError`, and its message
names the object at fault and what to do about it. The CLI layer prints them; this package only
raises and logs.
"""

from __future__ import annotations


class RegistryError(Exception):
    """Base class of every error raised by `registry`."""


class InvalidNameError(RegistryError, ValueError):
    """A model name does not follow the grammar (or could escape the store)."""


class InvalidDigestError(RegistryError, ValueError):
    """A digest string is not of the form ``sha256:<64 lowercase hex>``."""


class ModelNotFoundError(RegistryError, LookupError):
    """No manifest is stored under the requested name."""

    def __init__(self, name: str, near: list[str] | None = None) -> None:
        """`near`: stored names close to `name` (a misspelling is told its likely meaning, not to
        pull the misspelling)."""
        self.name, self.near = name, near or []
        if self.near:
            super().__init__(f"model {name!r} not found in the local store; did you mean "
                             f"{' or '.join(repr(n) for n in self.near)}? (`ft list` shows the local models)")
            return
        fetch = ("`ft pull PATH` to import its checkpoint again" if name.startswith("local/")
                 else f"`ft pull {name}` to download it")
        super().__init__(f"model {name!r} not found in the local store; run `ft list` to see local models or {fetch}")


class CorruptManifestError(RegistryError):
    """A manifest file cannot be parsed or fails validation."""

    def __init__(self, source: str, problem: str, name: str | None = None) -> None:
        self.source = source
        self.problem = problem
        fix = (
            f"remove it with `ft rm {name}` and pull it again with `ft pull {name}`"
            if name
            else "remove the model with `ft rm NAME` and pull it again"
        )
        super().__init__(f"corrupt manifest {source}: {problem}; {fix}")


class InvalidModelManifestError(CorruptManifestError):
    """A well-formed manifest of an ft model lacks a model's shape (no layers, no FTW index or
    two, no shard, an untitled or twice-listed file); `field` names the part at fault."""

    def __init__(self, source: str, field: str, problem: str, name: str | None = None) -> None:
        self.field = field
        super().__init__(source, f"{field}: {problem}", name)


class DigestMismatchError(RegistryError):
    """The content of a file does not hash to the digest it was declared with."""

    def __init__(self, what: str, expected: str, actual: str) -> None:
        self.what = what
        self.expected = expected
        self.actual = actual
        super().__init__(
            f"digest mismatch for {what}: expected {expected}, got {actual}; "
            "the file is corrupt or incomplete, download it again"
        )


class MissingBlobError(RegistryError):
    """One or more blobs a manifest needs are not in the store."""

    def __init__(self, digests: list[str], context: str) -> None:
        self.digests = list(digests)
        shown = ", ".join(self.digests[:4]) + (" ..." if len(self.digests) > 4 else "")
        super().__init__(f"{context}: {len(self.digests)} blob(s) missing from the store: {shown}")


class LockTimeoutError(RegistryError, TimeoutError):
    """A store lock stayed held by another process for longer than the timeout."""

    def __init__(self, what: str, timeout_s: float, holders: str) -> None:
        self.what = what
        self.timeout_s = timeout_s
        super().__init__(
            f"timed out after {timeout_s:g}s waiting for the lock on {what}, held by {holders}; "
            "wait for that process to finish (or stop it) and try again"
        )
