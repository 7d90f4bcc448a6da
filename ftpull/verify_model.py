"""`ft verify`'s checks of one model: every blob re-hashed (the registry), then the FTW index read
through ftw and held against the manifest (registry.verify.check_index_agrees: each shard the index
names is a shard layer, listed once, with the index's sha256 and size), then opened as a load
opens it (RegisteredModel.open_ftw: its layout, the tensors its family needs), every failing check
reported (RegisteredModel.index_problems), not only the first. All blobs hashing
right is not enough: an index whose shard sha256 differs from the manifest's digest would pass.
"""

from __future__ import annotations

from ftw import FTWError, Index
from registry import BadBlob, ModelName, ProgressFn, Store
from registry.model_manifest import MEDIA_FTW_INDEX
from registry.verify import Disagreement, check_index_agrees
from runtime.loading.registered import open_model

Problem = BadBlob | Disagreement


def verify_model(store: Store, name: ModelName | str, progress: ProgressFn | None = None) -> list[Problem]:
    """Every problem of the stored model `name`: bad blobs first, then what the index and the
    manifest disagree about. Empty when it is whole. Raises what `Store.read_manifest` raises."""
    manifest = store.read_manifest(name)
    bad: list[Problem] = list(store.verify(name, progress))
    index_layer = next(d for d in manifest.layers if d.media_type == MEDIA_FTW_INDEX)  # (one: read_manifest)
    if any(b.digest == index_layer.digest for b in bad if isinstance(b, BadBlob)):
        return bad  # the index itself is reported; what it says cannot be trusted
    origin = f"{index_layer.title} ({store.blob_path(index_layer.digest)})"
    try:
        index = Index.from_json(store.blob_path(index_layer.digest).read_bytes(), origin=origin)
    except (FTWError, OSError) as e:
        return [*bad, Disagreement(index_layer.title, "index", str(e))]
    disagreements = check_index_agrees(manifest, index.shards, index_layer.title)
    if not bad and not disagreements:
        try:  # the way a load opens it: layout, shard sizes and the tensors the family needs, each problem
            problems = open_model(store, name).index_problems()
        except FTWError as e:
            problems = [str(e)]
        disagreements += [Disagreement(index_layer.title, "index", p) for p in problems]
    return [*bad, *disagreements]
