"""A registered model's files: the manifest's layers, seen as an FTW model plus its side files.

The manifest names every file by title (its original file name) and digest; this module is the
one place that maps titles to blob paths and opens the FTW index. `ft pull` writes manifests
with these media types; the runtime, `ft show` and `ft verify` read them through here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ftw.check_tensors import index_tensor_problems
from ftw.errors import CorruptIndexError, CorruptShardError
from ftw.format import Index
from registry import Manifest, ModelName, Store
from registry.model_manifest import (  # noqa: F401 - re-exported: the media types were defined here
    MEDIA_CONFIG,
    MEDIA_FILE,
    MEDIA_FTW_INDEX,
    MEDIA_FTW_SHARD,
    MEDIA_MODELFILE,
    MEDIA_TEMPLATE,
)
from registry.verify import sampled_check

if TYPE_CHECKING:  # pragma: no cover
    from ftw import FTWReader


@dataclass(frozen=True)
class RegisteredModel:
    """One model in the store: its manifest, the summary config, and paths of its files."""

    name: ModelName
    manifest: Manifest
    config: dict[str, Any]
    files: dict[str, Path]  # title -> blob path, for every layer

    @property
    def context_length(self) -> int | None:
        """The most context its recipe allows (a Modelfile's CONTEXT, else the model's), or None."""
        value = self.config.get("context_length")
        return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None

    def file(self, title: str) -> Path | None:
        return self.files.get(title)

    def text(self, title: str) -> str | None:
        """The file titled `title` as text, None where the model has none; CorruptShardError
        naming it and the fix where its blob is gone or not UTF-8 (a damaged store)."""
        path = self.files.get(title)
        if path is None:
            return None
        try:
            return path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise CorruptShardError(f"{self.name.display}: {title} ({path}) cannot be read as text ({e}); run "
                                    f"`ft verify {self.name.display}`, which names the damaged files and how to get "
                                    "them again") from None

    def check_files(self) -> None:
        """Each of the model's files checked as a load can afford (present, its size, its sha256
        where it is small, else its sampled digest: registry.verify.sampled_check), so that a file
        rotted on the disk since it was stored is refused, not run: CorruptShardError naming it and
        the fix. Once a load (runnable.load_registered)."""
        for d in self.manifest.layers:
            bad = sampled_check(self.files[d.title], d)
            if bad is not None:
                raise CorruptShardError(f"{self.name.display}: {bad}; run `ft pull {self.name.display}` to fetch it "
                                        f"again (`ft verify {self.name.display}` checks every byte)")

    def open_ftw(self) -> FTWReader:
        """The FTW reader over this model's shards (layout checked, shards not re-hashed), its
        config, tensors and banks checked as a download's are (ftw/check_tensors.py): a stored
        index is read from a disk, and a value that crashed `ft run` must be refused by name."""
        index = self._read_index()
        reader = self._reader(index)
        problems = index_tensor_problems(index)
        if problems:
            reader.close()
            raise CorruptIndexError(self.unusable(str(problems[0])))
        return reader

    def index_problems(self) -> list[str]:
        """Every reason `open_ftw` would refuse this model, each as its message (`ft verify`
        reports them all; a load stops at the first): the layout's, then each failing check of
        the config, the dense tensors and the banks. Empty when it opens."""
        index = self._read_index()
        try:
            self._reader(index).close()
            layout = []
        except CorruptIndexError as e:
            layout = [str(e)]
        return [*layout, *(self.unusable(str(p)) for p in index_tensor_problems(index))]

    def _read_index(self) -> Index:
        index_path = next((self.files[d.title] for d in self.manifest.layers if d.media_type == MEDIA_FTW_INDEX), None)
        if index_path is None:
            raise CorruptIndexError(f"{self.name.display} has no FTW index in its manifest; re-pull it")
        return Index.from_json(index_path.read_bytes(), origin=f"{self.name.display}: model.ftw.json")

    def _reader(self, index: Index) -> FTWReader:
        """The reader over `index`'s shards; CorruptIndexError with the fix where its layout is wrong."""
        from ftw.reader import FTWReader  # (torch: only a load needs it)

        shards = {d.title: self.files[d.title] for d in self.manifest.layers if d.media_type == MEDIA_FTW_SHARD}
        origin = f"{self.name.display}: model.ftw.json"
        try:
            return FTWReader(index, shards, origin=origin)
        except CorruptIndexError as e:  # (the layout's messages name the problem; add the fix)
            raise CorruptIndexError(self.unusable(str(e).removeprefix(origin + ": "))) from None

    def unusable(self, problem: str) -> str:
        """The message of a stored model whose index its runtime cannot use: the problem and the fix."""
        name = self.name.display
        return (f"{name}: model.ftw.json: {problem}; the stored model is damaged or was written by another "
                f"converter: run `ft rm {name}` and `ft pull {name}` to convert it again")


def open_model(store: Store, name: ModelName | str) -> RegisteredModel:
    """Look up `name` in `store`; ModelNotFoundError / CorruptManifestError when it cannot."""
    from registry.names import as_name

    model_name = as_name(name)
    manifest = store.read_manifest(model_name)
    files = {d.title: store.blob_path(d.digest) for d in manifest.layers}
    config_path = store.blob_path(manifest.config.digest)
    try:
        config = json.loads(config_path.read_bytes())
    except (OSError, ValueError, RecursionError):
        config = {}
    return RegisteredModel(model_name, manifest, config if isinstance(config, dict) else {}, files)
