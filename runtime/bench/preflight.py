"""What `ft bench` checks before it builds anything: the device, the RAM, the files it reads and
the folder it writes. Built first, the default run's 54 GiB of host banks took a 24 GB machine
without CUDA down in a machine-wide out-of-memory kill; each refusal here names the numbers and
the option to pass instead."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import torch

from ..planner.plan import RAM_RESERVE_BYTES, size
from ..planner.resources import Machine
from .shapes import BenchShape

GiB = 1 << 30
DEVICE_PROBE_BYTES = 2 * GiB  # the device copy-rate probe's two buffers (moe.memory_gbps)
HOST_PROBE_BYTES = {"cuda": GiB, "cpu": 256 << 20}  # the host read-rate probe's buffer (ceilings.host_read_gbps)


def check_device(device: torch.device, budget_gib: float) -> None:
    """A CUDA device that is there, with the VRAM budget free (the cache is sized from it)."""
    if device.type != "cuda":
        return
    if not torch.cuda.is_available():
        raise ValueError("--device cuda needs a CUDA GPU and none was found: run `ft bench --device cpu --shape tiny`, "
                         "or a real shape with --device cpu --layers 2")
    free, total = torch.cuda.mem_get_info(device)
    need = max(int(budget_gib * GiB), DEVICE_PROBE_BYTES)
    if need > free:
        most = max(0.0, int((free - DEVICE_PROBE_BYTES // 4) / GiB * 10) / 10)
        raise ValueError(f"--budget-gib {budget_gib:g} needs {size(need)} of VRAM, {torch.cuda.get_device_name(device)} "
                         f"has {size(free)} free of {size(total)}: pass --budget-gib {most:g} or less, or free VRAM")


def check_host_memory(host_bytes: int, host_banks: int, shape: BenchShape, device: torch.device) -> None:
    """The host banks and the read-rate probe within the RAM available now."""
    available = Machine.probe().ram_available_bytes
    room = available - RAM_RESERVE_BYTES - HOST_PROBE_BYTES.get(device.type, HOST_PROBE_BYTES["cpu"])
    if host_bytes <= room:
        return
    per_bank = host_bytes // max(1, host_banks)
    fits = max(0, room // per_bank) if per_bank else 0
    raise ValueError(f"the {shape.name} host banks need {size(host_bytes)} ({host_banks} layers of {size(per_bank)}), "
                     f"{size(available)} of RAM is available: build fewer with --host-banks {max(1, fits)} (the layers "
                     f"share them, every read still made) or --layers {max(1, fits)}, or --shape tiny")


def check_paths(profile: str | None, profile_dir: str | None) -> None:
    """The profile it reads is there, and the folder the traces go to can be written: found after
    the banks were built and every policy ran, each failed the run at its end."""
    if profile is not None and not Path(profile).is_file():
        raise ValueError(f"--profile {profile}: no such file (a bandwidth profile JSON; leave it out to measure one)")
    if profile_dir is None:
        return
    try:
        Path(profile_dir).mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=profile_dir):
            pass
    except OSError as e:
        raise ValueError(f"--profile-dir {profile_dir}: cannot write there ({e.strerror or e}); pass a folder you "
                         "can write, with room for a trace per policy") from None
    if not os.access(profile_dir, os.W_OK):
        raise ValueError(f"--profile-dir {profile_dir}: cannot write there; pass a folder you can write")
