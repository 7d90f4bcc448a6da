"""`ft fit NAME`: what this machine can do with a model, before or after pulling it.

A model in the store is planned from its FTW index (exact sizes). Any other name is resolved as
`ft pull` would and planned from metadata only: config.json and the safetensors headers from the
Hub (small requests, never a weight byte), a local checkpoint's headers, or a GGUF file's size.
Where the Hub cannot be reached, a shipped recipe is planned from the footprint stored with it
(Modelfiles/footprints.json, ftpull/recipe_footprint.py), and the report says it is an estimate.
The planner is `runtime.planner.plan.plan`, the same function a pull and a load use.
"""

from __future__ import annotations

import tempfile
import textwrap
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from ftw import load_config
from ftw.safetensors_source import SafetensorsCheckpoint
from registry import DEFAULT_HOST, DEFAULT_NAMESPACE, InvalidNameError, ModelNotFoundError, Store
from runtime.loading.registered import RegisteredModel, open_model
from runtime.planner.plan import ModelFootprint, Plan, PlanOverrides, plan, size
from runtime.planner.resources import Machine

from . import hub
from .fetch import check_family, gguf_parts
from .modelfile import builtin_modelfiles
from .recipe_footprint import NoStoredFootprintError, log_if_stale, recipe_footprint
from .resolve import PullTarget, resolve

WIDTH = 80
SOURCES = {"ftw": "the FTW index in the store (exact)", "checkpoint": "config.json and safetensors headers (estimate)",
           "sizes": "file sizes only (estimate)",
           "recipe": "the recipe's stored footprint (estimate; not read from the model's files)"}


@dataclass(frozen=True)
class FitReport:
    name: str
    present: bool  # planned from the local FTW index
    footprint: ModelFootprint
    machine: Machine
    plan: Plan
    estimate_note: str | None = None  # why the sizes are the recipe's stored ones (the Hub could not be reached)


def fit(text: str, store: Store, overrides: PlanOverrides, machine: Machine | None = None) -> FitReport:
    """Plan `text` on `machine` (probed when None). Always returns the plan; `plan.problems` says
    whether it can run. The recipe's `num_ctx` parameter is the default context (lowered to fit;
    `overrides.num_ctx`, the user's, is planned exactly or refused)."""
    name, present, fp, num_ctx, note = _footprint(text, store)
    if overrides.default_num_ctx is None and num_ctx:
        overrides = replace(overrides, default_num_ctx=num_ctx)
    machine = machine or Machine.probe()
    return FitReport(name, present, fp, machine, plan(fp, machine, replace(overrides, force=True)), note)


def _footprint(text: str, store: Store) -> tuple[str, bool, ModelFootprint, int | None, str | None]:
    model = _local_model(text, store)
    if model is None:
        target = resolve(text)
        if store.has_model(target.name):
            model = open_model(store, target.name)
        else:
            fp, note = _offline_or_remote(target)
            return target.name.display, False, fp, _int(target.recipe.parameters.get("num_ctx")), note
    index = model.open_ftw().index
    name = model.name.display
    fp = ModelFootprint.from_index(index, name=name, context_length=model.context_length)
    return name, True, fp, _int((model.config.get("parameters") or {}).get("num_ctx")), None


class SizeUnknownOffline(hub.HubUnreachable):
    """`ft fit` of a shipped recipe that stores no footprint on purpose (Modelfiles/footprints.json's
    "unsized": its release's sizes could not be verified), while the Hub cannot be reached: its size
    is unknown, said so plainly, never guessed."""

    def __init__(self, name: str, reason: str, unreachable: hub.HubUnreachable) -> None:
        super().__init__(f"{name}: its size is unknown until the Hugging Face Hub answers: ft ships no offline "
                         f"footprint for this recipe ({reason}), and the Hub could not be reached ({unreachable}). "
                         f"Run `ft fit {name}` again with the network (or after `ft pull {name}`) to size it from "
                         "the checkpoint's config.json and headers")


def _offline_or_remote(target: PullTarget) -> tuple[ModelFootprint, str | None]:
    """The footprint from the Hub's metadata; where the Hub cannot be reached and `target` is a
    shipped recipe, the one stored with it, and a note that says so."""
    try:
        return _remote_footprint(target), None
    except hub.HubUnreachable as e:
        if not _shipped(target):
            raise
        try:
            fp = recipe_footprint(target.recipe, name=target.name.display)
        except NoStoredFootprintError as none:
            if none.reason is None:
                raise e from None
            raise SizeUnknownOffline(target.name.display, none.reason, e) from None
        return fp, (f"the Hub could not be reached ({e}), so these figures are the recipe's stored footprint, an "
                    "estimate, not sizes read from the model's files; `ft fit` with the network (or after "
                    "`ft pull`) gives them")


GGUF_ESTIMATE_TOLERANCE = 0.15  # how far a recipe's layout estimate may miss the file's real size and be used


def _gguf_layout(target: PullTarget, total: int) -> ModelFootprint | None:
    """A shipped recipe's GGUF file planned with a layout (cache slots, KV, the experts' records)
    before its header is read: the stored config's estimate for the file type
    (recipe_footprint.GGUF_FILE_TYPES), where it is within GGUF_ESTIMATE_TOLERANCE of the file's
    real size on the Hub; None otherwise (only the size is planned from)."""
    if not _shipped(target):
        return None
    try:
        fp = recipe_footprint(target.recipe, name=target.name.display)
    except NoStoredFootprintError:
        return None
    estimate = fp.dense_bytes + fp.expert_pool_bytes
    if not fp.layout_known or not total or abs(estimate - total) > GGUF_ESTIMATE_TOLERANCE * total:
        return None
    return fp


def _shipped(target: PullTarget) -> bool:
    name = target.name
    return name.host == DEFAULT_HOST and name.namespace == DEFAULT_NAMESPACE and name.model in builtin_modelfiles()


def _local_model(text: str, store: Store) -> RegisteredModel | None:
    try:
        return open_model(store, text)
    except (InvalidNameError, ModelNotFoundError):  # hf://..., a path, or not pulled yet
        return None


def _remote_footprint(target: PullTarget) -> ModelFootprint:
    recipe, source = target.recipe, target.recipe.source
    name, ctx = target.name.display, recipe.context_length
    if source.scheme == "builtin":  # built locally in a second: read what `ft pull` would convert
        from .tiny import build_tiny_checkpoint

        with tempfile.TemporaryDirectory() as tmp:
            return _local_checkpoint(target, build_tiny_checkpoint(Path(tmp) / "builtin"))
    if source.scheme == "local":
        path = Path(source.path or "")
        if path.is_file():
            total = sum(p.stat().st_size for p in gguf_parts(path))
            return ModelFootprint.from_sizes(expert_bytes=total, name=name, context_length=ctx or 0)
        return _local_checkpoint(target, path)
    assert source.repo_id is not None
    if source.scheme == "gguf":
        assert source.path is not None
        _, sizes = hub.fetch_file_sizes(source.repo_id, source.revision)
        parts = [str(p) for p in gguf_parts(Path(source.path))]
        total = sum(sizes.get(p, 0) for p in parts)
        return _gguf_layout(target, total) or ModelFootprint.from_sizes(expert_bytes=total, name=name,
                                                                        context_length=ctx or 0)
    remote = hub.fetch_checkpoint_info(source.repo_id, source.revision)
    check_family(recipe, remote.config)
    if _shipped(target):  # the footprint an offline `ft fit` uses, checked while the real config is here
        log_if_stale(recipe, remote.config)
    return ModelFootprint.from_checkpoint(remote.config, remote.tensors, target_dtype=recipe.dtype, name=name,
                                          context_length=ctx)


def _local_checkpoint(target: PullTarget, path: Path) -> ModelFootprint:
    config = load_config(path)
    check_family(target.recipe, config)
    with SafetensorsCheckpoint(path) as ckpt:
        tensors = {name: (t.dtype, t.nbytes) for name, t in ckpt.tensors.items()}
    return ModelFootprint.from_checkpoint(config, tensors, target_dtype=target.recipe.dtype,
                                          name=target.name.display, context_length=target.recipe.context_length)


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def machine_rows(m: Machine) -> list[tuple[str, str]]:
    rows = [("machine", f"{m.num_physical_cores} cores, {size(m.ram_total_bytes)} RAM "
                        f"({size(m.ram_available_bytes)} available)")]
    if m.gpu:
        rows.append(("GPU", f"{m.gpu.name}, {size(m.gpu.vram_free_bytes)} of {size(m.gpu.vram_total_bytes)} free"))
    return rows


def _wrap(prefix: str, text: str) -> str:
    return textwrap.fill(text, width=WIDTH, initial_indent=prefix, subsequent_indent=" " * 4)


def format_report(r: FitReport) -> str:
    """The table `ft fit` prints: one row per decision, then notes, warnings and problems."""
    fp = r.footprint
    shape = (f"{fp.family}, {fp.num_moe_layers} MoE layers x {fp.num_experts} experts, top-{fp.num_experts_per_tok}, "
             f"{fp.dtype}" if fp.layout_known else f"{fp.family}, layout unknown")
    rows = [("model", shape), ("sizes from", SOURCES.get(fp.source, fp.source) + ("" if r.present else ", not pulled")),
            *machine_rows(r.machine), *r.plan.describe()]
    if fp.kv.bytes_per_token:
        rows.append(("KV per token", fp.kv.formula))
    width = max(len(label) for label, _ in rows)
    indent = " " * (width + 4)
    lines = [r.name] + [f"  {label.ljust(width)}  " + f"\n{indent}".join(textwrap.wrap(value, WIDTH - len(indent)))
                        for label, value in rows]
    lines += [_wrap("note: ", n) for n in ([r.estimate_note] if r.estimate_note else []) + list(r.plan.notes)] + [_wrap("warning: ", w) for w in r.plan.warnings]
    if r.plan.problems:
        lines.append(f"{r.name} does not fit this machine:")
        lines += [_wrap("  - ", str(p)) for p in r.plan.problems]
        lines.append("(pull or run with --force to try anyway)")
    else:
        lines.append(f"fits: {'on the GPU' if r.plan.device == 'gpu' else 'on the CPU'}")
    return "\n".join(lines)


def report_dict(r: FitReport) -> dict[str, Any]:
    """`ft fit --json`."""
    return {"name": r.name, "present": r.present, "footprint": asdict(r.footprint), "machine": asdict(r.machine),
            "plan": r.plan.to_dict(), "estimate_note": r.estimate_note}
