"""Will it fit? Disk and host RAM checks made from the config and safetensors headers alone.

Runs before a single weight byte is downloaded. The disk check is here; RAM (and, on a probed
machine, VRAM and context) is the fit planner's (`runtime.planner.plan`), the same function `ft fit`
and loading use, so pull and run agree. A refusal says what is needed, what the machine has, and
what to change.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from ftw.families import Family, parse_expert_name
from runtime.planner.footprint import converted_bytes
from runtime.planner.plan import (
    RAM_RESERVE_BYTES,
    FitError,
    ModelFootprint,
    PlanOverrides,
    plan,
)
from runtime.planner.resources import GPU, Machine

__all__ = ["RAM_RESERVE_BYTES", "FitError", "Footprint", "Resources", "check_fit", "footprint", "refuse_unless_fits"]

DISK_SLACK = 1.02  # alignment padding, index, tokenizer files


@dataclass(frozen=True)
class Footprint:
    """Sizes of a checkpoint as ft will store and load it."""

    download_bytes: int  # still to download (what is already on disk is not counted)
    expert_bytes: int  # routed experts, as stored in FTW
    dense_bytes: int  # everything else, as stored in FTW
    model: ModelFootprint | None = None  # the planner's view, when the config is known

    @property
    def ftw_bytes(self) -> int:
        return int((self.expert_bytes + self.dense_bytes) * DISK_SLACK)

    def for_planner(self) -> ModelFootprint:
        return self.model or ModelFootprint.from_sizes(expert_bytes=self.expert_bytes, dense_bytes=self.dense_bytes)


@dataclass(frozen=True)
class Resources:
    """Disk plus the machine. Made by hand (no `machine`), it knows only RAM and whether there is a GPU."""

    disk_free_bytes: int
    ram_total_bytes: int
    ram_available_bytes: int
    has_gpu: bool
    machine: Machine | None = None  # measured by probe()

    @staticmethod
    def probe(disk_free_bytes: int) -> Resources:
        m = Machine.probe()
        return Resources(disk_free_bytes, m.ram_total_bytes, m.ram_available_bytes, m.gpu is not None, m)


def footprint(
    family: Family,
    num_layers: int,
    tensors: dict[str, tuple[str, int]],
    download_bytes: int,
    target_dtype: str = "auto",
    config: dict[str, Any] | None = None,
) -> Footprint:
    """Expert and dense bytes after conversion, from (FTW dtype, nbytes) per source tensor.

    With the checkpoint's `config` the planner also gets the expert layout and the KV size."""
    expert = dense = 0
    for source_name, (dtype, nbytes) in tensors.items():
        name = family.tensor_name(source_name)  # (DeepSeek-V4's release names its own way)
        if not family.keeps(name, num_layers):
            continue
        parsed = parse_expert_name(name)
        _, stored = converted_bytes(parsed, name, dtype, nbytes, target_dtype)
        if parsed is not None:
            expert += stored
        else:
            dense += stored
    model = ModelFootprint.from_checkpoint(config, tensors, target_dtype=target_dtype) if config is not None else None
    return Footprint(download_bytes=download_bytes, expert_bytes=expert, dense_bytes=dense, model=model)


def gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB"


def check_fit(fp: Footprint, res: Resources, overrides: PlanOverrides | None = None) -> list[str]:
    """Every reason the model cannot be pulled and run here (empty when it fits)."""
    problems = []
    disk_needed = fp.download_bytes + fp.ftw_bytes
    if disk_needed > res.disk_free_bytes:
        problems.append(
            f"disk: needs {gib(disk_needed)} ({gib(fp.download_bytes)} still to download + "
            f"{gib(fp.ftw_bytes)} converted), {gib(res.disk_free_bytes)} free; free space or set FT_HOME to a larger disk"
        )
    overrides = overrides or PlanOverrides()
    if res.machine is not None:
        machine, ram_only = res.machine, False
    else:  # only RAM is known: a GPU is taken to hold the dense weights, as DESIGN.md §5 places them
        gpu = GPU("GPU", 0, 0) if res.has_gpu else None
        machine, ram_only = Machine(res.ram_total_bytes, res.ram_available_bytes, 1, gpu), True
        overrides = replace(overrides, device="gpu") if res.has_gpu else overrides
    fit = plan(fp.for_planner(), machine, replace(overrides, force=True))
    problems += [str(p) for p in fit.problems if not ram_only or p.resource == "RAM"]
    return problems


def refuse_unless_fits(model: str, fp: Footprint, res: Resources, *, force: bool) -> None:
    problems = check_fit(fp, res)
    if problems and not force:
        raise FitError(f"{model} does not fit this machine:\n  - " + "\n  - ".join(problems) + "\n(--force pulls anyway)")
