"""Manifests: which blobs make up a model.

A manifest is JSON in the shape of an OCI image manifest::

    {"schemaVersion": 2,
     "mediaType": "application/vnd.ft.manifest.v1+json",
     "config": {"mediaType": ..., "digest": "sha256:<hex>", "size": 123, "annotations": {...}},
     "layers": [{...}, ...]}

`Manifest.from_json` trusts nothing: every field is type-checked and every digest validated, and
any problem raises `CorruptManifestError` naming the file.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import Any

from .errors import CorruptManifestError, InvalidDigestError

SCHEMA_VERSION = 2
MEDIA_TYPE_MANIFEST = "application/vnd.ft.manifest.v1+json"
# the annotation that gives a blob its human name (a shard file name, "config", ...)
ANNOTATION_TITLE = "org.opencontainers.image.title"

DIGEST_RE = re.compile(r"sha256:[0-9a-f]{64}")


def check_digest(digest: str) -> str:
    """Return `digest` if it is ``sha256:<64 lowercase hex>``, else raise `InvalidDigestError`."""
    if not isinstance(digest, str) or not DIGEST_RE.fullmatch(digest):
        raise InvalidDigestError(f"invalid digest {digest!r}: expected 'sha256:' and 64 lowercase hex digits")
    return digest


@dataclass(frozen=True)
class Descriptor:
    """One blob of a model: its media type, sha256 digest, size in bytes and annotations."""

    media_type: str
    digest: str
    size: int
    annotations: dict[str, str] = field(default_factory=dict)

    @property
    def title(self) -> str:
        """The blob's human name (its title annotation) or, failing that, its digest."""
        return self.annotations.get(ANNOTATION_TITLE, self.digest)

    def to_dict(self) -> dict[str, Any]:
        """The JSON object of this descriptor."""
        out: dict[str, Any] = {"mediaType": self.media_type, "digest": self.digest, "size": self.size}
        if self.annotations:
            out["annotations"] = dict(sorted(self.annotations.items()))
        return out

    @classmethod
    def from_dict(cls, obj: Any, where: str) -> Descriptor:
        """Build from parsed JSON; raises ValueError describing the first problem at `where`."""
        if not isinstance(obj, dict):
            raise ValueError(f"{where} is {type(obj).__name__}, expected an object")
        media_type = obj.get("mediaType")
        if not isinstance(media_type, str) or not media_type:
            raise ValueError(f"{where}.mediaType must be a non-empty string, got {media_type!r}")
        digest = obj.get("digest")
        if not isinstance(digest, str) or not DIGEST_RE.fullmatch(digest):
            raise ValueError(f"{where}.digest {digest!r} is not 'sha256:' + 64 lowercase hex digits")
        size = obj.get("size")
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise ValueError(f"{where}.size must be a non-negative integer, got {size!r}")
        annotations = obj.get("annotations", {})
        if not isinstance(annotations, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in annotations.items()
        ):
            raise ValueError(f"{where}.annotations must map strings to strings")
        return cls(media_type=media_type, digest=digest, size=size, annotations=dict(annotations))


@dataclass(frozen=True)
class Manifest:
    """A model's manifest: one config blob and an ordered list of layer blobs."""

    config: Descriptor
    layers: list[Descriptor]
    schema_version: int = SCHEMA_VERSION
    media_type: str = MEDIA_TYPE_MANIFEST

    def __post_init__(self) -> None:
        if not isinstance(self.config, Descriptor):
            raise TypeError(f"Manifest.config must be a Descriptor, got {type(self.config).__name__}")
        if not all(isinstance(d, Descriptor) for d in self.layers):
            raise TypeError("Manifest.layers must all be Descriptors")
        for d in self.blobs:
            check_digest(d.digest)

    @property
    def blobs(self) -> list[Descriptor]:
        """The config followed by the layers."""
        return [self.config, *self.layers]

    @property
    def digests(self) -> set[str]:
        """Every digest the manifest references."""
        return {d.digest for d in self.blobs}

    @property
    def total_size(self) -> int:
        """Bytes of all distinct blobs."""
        return sum({d.digest: d.size for d in self.blobs}.values())

    def find(self, title: str) -> Descriptor | None:
        """The first blob whose title annotation is `title`, if any."""
        return next((d for d in self.blobs if d.annotations.get(ANNOTATION_TITLE) == title), None)

    def to_dict(self) -> dict[str, Any]:
        """The JSON object of this manifest."""
        return {
            "schemaVersion": self.schema_version,
            "mediaType": self.media_type,
            "config": self.config.to_dict(),
            "layers": [d.to_dict() for d in self.layers],
        }

    def to_json(self) -> bytes:
        """Canonical UTF-8 JSON bytes (sorted keys, indented, trailing newline)."""
        return (json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n").encode()

    @property
    def digest_hex(self) -> str:
        """The sha256 of the canonical JSON: the model's identity (Ollama's digest and ID)."""
        return hashlib.sha256(self.to_json()).hexdigest()

    @classmethod
    def from_json(cls, data: bytes | str, source: str = "<manifest>", name: str | None = None) -> Manifest:
        """Parse and validate manifest JSON; `source` (a file path) and `name` go into errors.

        Raises `CorruptManifestError` for malformed JSON, wrong types, bad digests or an
        unsupported schema version or media type.
        """
        try:
            obj = json.loads(data)
        except (ValueError, RecursionError) as exc:
            raise CorruptManifestError(source, f"not valid JSON ({exc})", name) from None
        try:
            return cls.from_dict(obj)
        except ValueError as exc:
            raise CorruptManifestError(source, str(exc), name) from None

    @classmethod
    def from_dict(cls, obj: Any) -> Manifest:
        """Build from parsed JSON; raises ValueError describing the first problem."""
        if not isinstance(obj, dict):
            raise ValueError(f"top level is {type(obj).__name__}, expected an object")
        version = obj.get("schemaVersion")
        if isinstance(version, bool) or not isinstance(version, int):
            raise ValueError(f"schemaVersion must be an integer, got {version!r}")
        if version != SCHEMA_VERSION:
            raise ValueError(f"schemaVersion {version} is not supported (this ft reads {SCHEMA_VERSION})")
        media_type = obj.get("mediaType")
        if media_type != MEDIA_TYPE_MANIFEST:
            raise ValueError(f"mediaType {media_type!r} is not {MEDIA_TYPE_MANIFEST!r}")
        config = Descriptor.from_dict(obj.get("config"), "config")
        layers = obj.get("layers")
        if not isinstance(layers, list):
            raise ValueError(f"layers must be a list, got {type(layers).__name__}")
        return cls(
            config=config,
            layers=[Descriptor.from_dict(d, f"layers[{i}]") for i, d in enumerate(layers)],
            schema_version=version,
            media_type=media_type,
        )
