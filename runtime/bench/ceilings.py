"""The hardware ceilings `ft bench`'s roofline is computed from, measured on the machine it runs on.

The bandwidth profile holds the rates the runtime itself reaches (its fill kernel over PCIe, its
CPU expert kernel): what the split is planned with. A roofline from those would count the
runtime's own shortfall as the hardware's: on the H200 host the profile's PCIe rate, through the
fill kernel, was 46-49 GB/s where pinned copies of expert records reach 54-55 GB/s (the device
README's ceiling). So the roofline takes each side's rate alone up to its ceiling here:

- PCIe: host-to-device copies of expert-sized records from pinned memory (the README's measure),
  divided by `pcie_repeat` where a slower link is emulated;
- the CPU: a host memory read by the benchmark's threads, the most its expert kernel can stream.

Off CUDA the "link" is a host copy: the figures keep their shape for CI, not a meaning.
"""

from __future__ import annotations

import time
from dataclasses import replace

import torch

from ..gpu import BandwidthProfile

REPS = 5


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def link_gbps(device: torch.device, record_bytes: int, count: int = 64, pcie_repeat: int = 1) -> float:
    """GB/s of `count` host-to-device copies of `record_bytes` each from pinned memory, best of REPS."""
    record_bytes = max(1, record_bytes)
    src = torch.ones(count, record_bytes, dtype=torch.uint8, pin_memory=device.type == "cuda")
    dst = torch.empty(count, record_bytes, dtype=torch.uint8, device=device)
    times = []
    for rep in range(REPS + 1):
        _sync(device)
        start = time.perf_counter()
        for row in range(count):
            dst[row].copy_(src[row], non_blocking=True)
        _sync(device)
        if rep:  # the first pass warms the allocator and the link
            times.append(time.perf_counter() - start)
    return count * record_bytes / min(times) / 1e9 / max(1, pcie_repeat)


def host_read_gbps(threads: int, nbytes: int = 1 << 30) -> float:
    """GB/s of one read over `nbytes` of host memory (larger than any CPU cache) by `threads`."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        data = torch.ones(nbytes // 4, dtype=torch.float32)
        times = []
        for rep in range(REPS + 1):
            start = time.perf_counter()
            float(data.sum())
            if rep:
                times.append(time.perf_counter() - start)
        return nbytes / min(times) / 1e9
    finally:
        torch.set_num_threads(before)


def ceiling_profile(profile: BandwidthProfile, link: float, host_read: float) -> BandwidthProfile:
    """`profile` with each side's rate alone raised to its ceiling (never lowered), and its rate
    beside the other side raised in the same ratio (the contention the profile measured is kept)."""
    def raised(beside: float, alone: float, ceiling: float) -> tuple[float, float]:
        alone = alone or beside
        top = max(alone, ceiling)
        return beside * top / alone, top

    pcie, pcie_alone = raised(profile.pcie_gbps, profile.pcie_alone_gbps, link)
    cpu, cpu_alone = raised(profile.cpu_gbps, profile.cpu_alone_gbps, host_read)
    return replace(profile, pcie_gbps=pcie, pcie_alone_gbps=pcie_alone, cpu_gbps=cpu, cpu_alone_gbps=cpu_alone)
