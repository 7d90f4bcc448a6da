"""What a stored ft model's manifest must hold, beyond being a well-formed manifest.

A manifest whose config has the media type `MEDIA_CONFIG` is an ft model: `ft pull` and `ft create`
write it with one FTW index layer, at least one FTW shard layer and side files, every layer titled
with its file name (the runtime finds files by title). `check_model_manifest` refuses any other
shape at read time, as an OCI registry refuses a manifest that names a missing blob: a manifest
with no layers, no index, two indexes or no shard would otherwise pass `ft verify` and fail later.
Manifests of other config types (the registry's own tests store plain blobs) are not models and
are only checked as manifests.
"""

from __future__ import annotations

from collections import Counter

from .errors import InvalidModelManifestError
from .manifest import ANNOTATION_TITLE, Manifest

MEDIA_CONFIG = "application/vnd.ft.config.v1+json"
MEDIA_FTW_INDEX = "application/vnd.ft.ftw.index.v1+json"
MEDIA_FTW_SHARD = "application/vnd.ft.ftw.shard"
MEDIA_MODELFILE = "application/vnd.ft.modelfile"
MEDIA_TEMPLATE = "application/vnd.ft.template"
MEDIA_FILE = "application/vnd.ft.file"  # tokenizer, generation config, license, ...


def model_manifest_problem(manifest: Manifest) -> tuple[str, str] | None:
    """The first way `manifest` (if an ft model's) breaks the model shape: (field, problem), or None."""
    if manifest.config.media_type != MEDIA_CONFIG:
        return None
    layers = manifest.layers
    if not layers:
        return "layers", "the list is empty; an ft model needs its FTW index and at least one shard"
    for i, d in enumerate(layers):
        if not d.annotations.get(ANNOTATION_TITLE):
            return f"layers[{i}].annotations", f"lacks {ANNOTATION_TITLE!r} (the file name the model finds it by)"
    indexes = [i for i, d in enumerate(layers) if d.media_type == MEDIA_FTW_INDEX]
    if not indexes:
        return "layers[].mediaType", f"no layer is the FTW index ({MEDIA_FTW_INDEX})"
    if len(indexes) > 1:
        return f"layers[{indexes[1]}].mediaType", f"layers {indexes} are all FTW indexes; a model has exactly one"
    if not any(d.media_type == MEDIA_FTW_SHARD for d in layers):
        return "layers[].mediaType", f"no layer is an FTW shard ({MEDIA_FTW_SHARD}); the weights are not listed"
    titles = Counter(d.title for d in layers)
    for i, d in enumerate(layers):
        if titles[d.title] > 1:
            return f"layers[{i}].annotations", f"the file name {d.title!r} is listed {titles[d.title]} times"
    return None


def check_model_manifest(manifest: Manifest, source: str, name: str | None = None) -> Manifest:
    """Return `manifest`, or raise `InvalidModelManifestError` naming `source` (the manifest's
    file), the field at fault and the fix, where an ft model's manifest lacks its shape."""
    problem = model_manifest_problem(manifest)
    if problem is not None:
        raise InvalidModelManifestError(source, *problem, name=name)
    return manifest
