"""What this machine has for the fit planner: host RAM, physical cores, and the GPU's VRAM.

The only I/O of planning lives here (`Machine.probe`); `runtime.planner.plan.plan` is a pure function of
a `Machine`, so tests describe machines as plain numbers. Disk is not the planner's business:
`ft pull` checks it on its own.
"""

from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass

import psutil

log = logging.getLogger(__name__)


MAX_BUDGET_GIB = 1 << 20  # a PiB: above any machine's memory, below the sizes that overflow


def gib_to_bytes(gib: float, what: str = "a VRAM budget", *, zero_ok: bool = False) -> int:
    """A budget given in GiB (CLI, API, REPL) as bytes, or ValueError naming what is wrong with
    it: not a number, not finite, negative (or 0 unless `zero_ok`), or beyond a PiB."""
    if isinstance(gib, bool) or not isinstance(gib, (int, float)) or not math.isfinite(gib):
        raise ValueError(f"{what} is a number of GiB, not {gib!r}")
    if gib < 0 or (gib == 0 and not zero_ok) or gib > MAX_BUDGET_GIB:
        low = "0 or more" if zero_ok else "more than 0"
        raise ValueError(f"{what} is {low} and at most {MAX_BUDGET_GIB} GiB, not {gib:g} GiB")
    return int(gib * (1 << 30))


@dataclass(frozen=True)
class GPU:
    """One CUDA device. `vram_free_bytes` is what other programs leave free right now."""

    name: str
    vram_total_bytes: int
    vram_free_bytes: int


@dataclass(frozen=True)
class Machine:
    """Host resources as the planner sees them."""

    ram_total_bytes: int
    ram_available_bytes: int  # free + reclaimable now; the plan is made against the total, this warns
    num_physical_cores: int
    gpu: GPU | None = None
    # A platform limit on page-locked (pinned) host memory; None when none is known. Users cap
    # pinning with PlanOverrides.max_pinned_bytes.
    max_pinned_bytes: int | None = None

    @staticmethod
    def probe() -> Machine:
        """Measure this machine. Never raises for a missing or broken CUDA: that is a CPU-only machine."""
        vm = psutil.virtual_memory()
        cores = psutil.cpu_count(logical=False) or os.cpu_count() or 1
        return Machine(ram_total_bytes=vm.total, ram_available_bytes=vm.available, num_physical_cores=cores,
                       gpu=probe_gpu())


def probe_gpu(device: int = 0) -> GPU | None:
    """The first CUDA device with its free and total VRAM, or None (no torch, no CUDA, driver error)."""
    try:
        import torch

        if not torch.cuda.is_available():
            return None
        free, total = torch.cuda.mem_get_info(device)
        return GPU(name=torch.cuda.get_device_name(device), vram_total_bytes=int(total), vram_free_bytes=int(free))
    except Exception as e:  # a broken CUDA install must not stop planning; it plans CPU-only
        log.warning("CUDA is present but unusable (%s: %s); planning for the CPU only", type(e).__name__, e)
        return None


class NoGPUError(RuntimeError):
    """--device gpu on a machine without a usable CUDA GPU."""
