"""Converting a fetched source to FTW and registering it: blobs first, the manifest last."""

from __future__ import annotations

import contextlib
import json
import logging
import shutil
from dataclasses import replace
from pathlib import Path

from ftw.format import INDEX_FILENAME, Index
from registry import ANNOTATION_TITLE, Descriptor, Manifest, ModelName, Store
from runtime.loading.registered import (
    MEDIA_CONFIG,
    MEDIA_FILE,
    MEDIA_FTW_INDEX,
    MEDIA_FTW_SHARD,
    MEDIA_MODELFILE,
    MEDIA_TEMPLATE,
    open_model,
)
from runtime.text.chat_template import ChatTemplateError
from runtime.text.tokenizer import Tokenizer, TokenizerError

from . import hub
from .events import ByteCounter, PullEvent, Report
from .fetch import Fetched, PullError, check_family, gguf_parts
from .modelfile import DEFAULT_TAG, FAMILY_FROM_CONFIG, Modelfile, Recipe, parse_source
from .resolve import PullTarget

log = logging.getLogger(__name__)

HF_SIDE_FILES = hub.AUX_FILES[1:]  # everything but config.json, which lives in the FTW index


def convert_and_register(target: PullTarget, store: Store, fetched: Fetched, work: Path, report: Report) -> Manifest:
    from ftw import GGUF_SIDE_FILES, convert_checkpoint, convert_gguf  # (torch, numpy, gguf: a conversion's)
    from runtime.loading.family_tensors import check_family_tensors  # (checked before anything is written)

    recipe = target.recipe
    out = work / "ftw"
    if fetched.format == "gguf":
        total = sum(p.stat().st_size for p in gguf_parts(fetched.path) if p.is_file())
        progress = ByteCounter(report, "converting to FTW", total)  # (file sizes: metadata included)
        index = convert_gguf(fetched.path, out, progress=progress, family_check=check_family_tensors)
        progress.finish()
        check_family(recipe, index.source_config)  # GGUF metadata names the architecture only now
        side_files = [out / name for name in GGUF_SIDE_FILES if (out / name).is_file()]
    else:
        total = sum(p.stat().st_size for p in fetched.path.glob("*.safetensors"))
        progress = ByteCounter(report, "converting to FTW", total)  # (file sizes: headers included)
        index = convert_checkpoint(fetched.path, out, dtype=recipe.dtype, progress=progress,
                                   family_check=check_family_tensors)
        progress.finish()
        side_files = []
        for name in HF_SIDE_FILES:
            if (fetched.path / name).is_file():
                shutil.copyfile(fetched.path / name, work / name)  # the source keeps its copy
                side_files.append(work / name)
    if recipe.dtype not in ("auto", index.config.get("dtype")) and fetched.format == "gguf":
        raise PullError(f"{recipe.ref}: DTYPE {recipe.dtype} was asked for, the GGUF file holds {index.config.get('dtype')}")
    check_tokenizer(recipe, side_files, index.config.get("vocab_size"))

    report(PullEvent("verifying sha256 digests"))
    layers = [_add(store, out / INDEX_FILENAME, MEDIA_FTW_INDEX, INDEX_FILENAME)]
    layers += [_add(store, out / s.name, MEDIA_FTW_SHARD, s.name, "sha256:" + s.sha256) for s in index.shards]
    layers += [_add(store, path, MEDIA_FILE, path.name) for path in side_files]
    layers.append(_add_bytes(store, modelfile_text(recipe, index.family).encode(), MEDIA_MODELFILE, "Modelfile"))
    if recipe.template and recipe.template != "checkpoint":
        layers.append(_add_bytes(store, recipe.template.encode(), MEDIA_TEMPLATE, "template.jinja"))
    config = store.add_blob_bytes(json.dumps(summary(recipe, index, fetched.revision), indent=1, sort_keys=True).encode())
    manifest = Manifest(config=config.descriptor(MEDIA_CONFIG), layers=layers)
    report(PullEvent("writing manifest"))
    store.write_manifest(target.name, manifest)
    return manifest


def register_variant(target: PullTarget, store: Store, base: ModelName, report: Report) -> Manifest:
    """Register `target` as a variant of the stored model `base` (Ollama's `FROM MODEL`): the base's
    weights and files, their blobs shared (nothing converted or copied), under the base's recipe
    with the fields `target` states replaced: SYSTEM, TEMPLATE, LICENSE, DESCRIPTION, CONTEXT, MESSAGEs (all of them), and
    PARAMETERs key by key (a stated `stop` replaces the list). FAMILY and DTYPE may only restate
    the base's: other weights need their source. The caller holds the name's lock."""
    recipe = target.recipe
    model = open_model(store, base)
    config = dict(model.config)
    family, dtype = config.get("family"), config.get("dtype")
    if recipe.family not in (FAMILY_FROM_CONFIG, family, config.get("model_type")):
        raise PullError(f"{recipe.ref}: FAMILY {recipe.family}, but {base.display} is {family}; leave FAMILY out")
    if recipe.dtype not in ("auto", dtype):
        raise PullError(f"{recipe.ref}: DTYPE {recipe.dtype}, but a variant of {base.display} keeps its {dtype} weights; "
                        f"to convert again, make it FROM {base.display}'s source ({config.get('source')})")
    report(PullEvent(f"using {base.display}'s weights"))
    kept = [d for d in model.manifest.layers if d.media_type not in (MEDIA_MODELFILE, MEDIA_TEMPLATE)]
    base_template = next((d for d in model.manifest.layers if d.media_type == MEDIA_TEMPLATE), None)
    template_text = recipe.template
    if template_text is None and base_template is not None:  # the base's own TEMPLATE goes on
        template_text = store.blob_path(base_template.digest).read_text(encoding="utf-8")
    parameters = dict(config.get("parameters") or {})
    if "stop" in recipe.parameters:
        parameters.pop("stop", None)
    parameters.update(recipe.parameters)
    merged = replace(recipe, family=family or recipe.family, dtype="auto", template=template_text,
                     system=_stated(recipe.system, config.get("system")), parameters=parameters,
                     license=_stated(recipe.license, config.get("license")),
                     description=_stated(recipe.description, config.get("description")),
                     context_length=recipe.context_length or config.get("context_length"),
                     messages=recipe.messages or tuple((m["role"], m["content"]) for m in config.get("messages") or ()))
    with contextlib.suppress(ValueError, TypeError):  # the stored Modelfile names where the weights came from
        merged = replace(merged, source=parse_source(str(config.get("source"))))
    layers = kept + [_add_bytes(store, modelfile_text(merged, merged.family).encode(), MEDIA_MODELFILE, "Modelfile")]
    if template_text and template_text != "checkpoint":
        layers.append(_add_bytes(store, template_text.encode(), MEDIA_TEMPLATE, "template.jinja"))
    config.update(parameters=parameters, system=merged.system, license=merged.license, description=merged.description,
                  context_length=merged.context_length, variant_of=base.display, messages=stored_messages(merged))
    blob = store.add_blob_bytes(json.dumps(config, indent=1, sort_keys=True).encode())
    manifest = Manifest(config=blob.descriptor(MEDIA_CONFIG), layers=layers)
    report(PullEvent("writing manifest"))
    store.write_manifest(target.name, manifest)
    return manifest


def stored_messages(recipe: Recipe) -> list[dict[str, str]]:
    """The recipe's MESSAGEs as the config blob keeps them (chat messages: a run's first history)."""
    return [{"role": role, "content": content} for role, content in recipe.messages]


def _stated(value: str | None, inherited: object) -> str | None:
    return value if value is not None else inherited if isinstance(inherited, str) else None


def check_tokenizer(recipe: Recipe, side_files: list[Path], vocab_size: object) -> None:
    """PullError where the tokenizer that comes with the weights has ids past the model's embedding
    (its files are another model's: every run would fail). One that cannot be loaded here is
    registered with a warning: a newer `tokenizers` may read it, with no new download. A source
    without tokenizer.json registers (its runs say what is missing)."""
    files = {path.name: path for path in side_files}
    if "tokenizer.json" not in files:
        log.warning("%s has no tokenizer.json: ft run and ft serve need one to run it", recipe.ref)
        return
    try:
        tokenizer = Tokenizer.from_files(files, origin=recipe.ref)
    except (TokenizerError, ChatTemplateError) as e:
        log.warning("%s; the model is registered, and runs need a tokenizer that loads", e)
        return
    try:
        tokenizer.check_fits(vocab_size)
    except TokenizerError as e:
        raise PullError(f"{e}; nothing was registered") from None


def _add(store: Store, path: Path, media_type: str, title: str, digest: str | None = None) -> Descriptor:
    return store.add_blob_file(path, digest=digest).descriptor(media_type, {ANNOTATION_TITLE: title})


def _add_bytes(store: Store, data: bytes, media_type: str, title: str) -> Descriptor:
    return store.add_blob_bytes(data).descriptor(media_type, {ANNOTATION_TITLE: title})


def modelfile_text(recipe: Recipe, family: str) -> str:
    """The recipe as canonical Modelfile text, stored with the model so `ft show` can print it."""
    single = replace(recipe, tag=DEFAULT_TAG, family=family)
    return Modelfile(path=None, default=single, tags={DEFAULT_TAG: single}).to_text()


def summary(recipe: Recipe, index: Index, revision: str | None) -> dict:
    """The manifest's config blob: what `ft list` and `ft show` print without opening the index."""
    c = index.config
    keys = ("family", "model_type", "dtype", "num_layers", "hidden_size", "vocab_size", "num_experts",
            "num_experts_per_tok", "num_shared_experts", "moe_intermediate_size", "context_length",
            "num_params_total", "num_params_active")
    out = {k: c.get(k) for k in keys}
    out.update(format="ftw", ftw_version=index.version, source=recipe.source.uri(),
               description=recipe.description, parameters=dict(recipe.parameters), system=recipe.system,
               license=recipe.license, messages=stored_messages(recipe),
               context_length=recipe.context_length or c.get("context_length"))
    if revision:
        out["revision"] = revision
    return out
