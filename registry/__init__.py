"""The local model store: validated names, manifests, sha256-addressed blobs, locks, gc, verify.

Imports nothing from the rest of ft. Typical use by a pull::

    store = Store.default()
    store.cleanup_stale()
    name = parse_name("qwen3:30b")
    with store.pull_session(), store.lock(name), store.temp_dir("pull") as work:
        ref = store.add_blob_file(work / "shard-0.ftw", digest=expected)
        layers = [ref.descriptor("application/vnd.ft.ftw.shard", {ANNOTATION_TITLE: "shard-0.ftw"})]
        config = store.add_blob_bytes(config_json).descriptor("application/vnd.ft.config+json")
        store.write_manifest(name, Manifest(config=config, layers=layers))
"""

from .atomic import AtomicWriter, atomic_write_bytes, fsync_dir
from .blobs import BlobRef, ProgressFn, digest_bytes, hash_file
from .errors import (
    CorruptManifestError,
    DigestMismatchError,
    InvalidDigestError,
    InvalidModelManifestError,
    InvalidNameError,
    LockTimeoutError,
    MissingBlobError,
    ModelNotFoundError,
    RegistryError,
)
from .listing import ModelEntry, SkippedManifest
from .manifest import (
    ANNOTATION_TITLE,
    MEDIA_TYPE_MANIFEST,
    SCHEMA_VERSION,
    Descriptor,
    Manifest,
    check_digest,
)
from .names import DEFAULT_HOST, DEFAULT_NAMESPACE, DEFAULT_TAG, ModelName, as_name, parse_name
from .store import Store
from .verify import BadBlob

__all__ = [
    "ANNOTATION_TITLE",
    "DEFAULT_HOST",
    "DEFAULT_NAMESPACE",
    "DEFAULT_TAG",
    "MEDIA_TYPE_MANIFEST",
    "SCHEMA_VERSION",
    "AtomicWriter",
    "BadBlob",
    "BlobRef",
    "CorruptManifestError",
    "Descriptor",
    "DigestMismatchError",
    "InvalidDigestError",
    "InvalidModelManifestError",
    "InvalidNameError",
    "LockTimeoutError",
    "Manifest",
    "MissingBlobError",
    "ModelEntry",
    "ModelName",
    "ModelNotFoundError",
    "ProgressFn",
    "RegistryError",
    "SkippedManifest",
    "Store",
    "as_name",
    "atomic_write_bytes",
    "check_digest",
    "digest_bytes",
    "fsync_dir",
    "hash_file",
    "parse_name",
]
