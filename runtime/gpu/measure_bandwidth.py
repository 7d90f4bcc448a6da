"""Measuring a BandwidthProfile (bandwidth_profile.py) through the executor itself (the runtime's own
fill kernel and CPU worker), with calls queued back to back as decode queues them: each side
alone at two miss counts, so its fixed per-call cost comes apart from its rate, then both at
once, for how much the rates drop beside each other (the fills and the CPU kernel share host
DRAM). On CUDA each batch is timed on the device, behind a head start that lets the launching
thread queue the whole batch first (`_HeadStart`): what is measured is the pipeline of device
and CPU worker, not the host's launches.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable

import torch

from ..experts import ExpertExecutor, HostExpertBank
from .bandwidth_profile import PROFILE_VERSION, BandwidthProfile, bank_dtype, machine_key, profiles_dir
from .executor import HybridExpertExecutor
from .expert_cache import ExpertCache

log = logging.getLogger(__name__)


def measure(bank: HostExpertBank, cpu_executor: ExpertExecutor, device: torch.device | str, *,
            num_experts: int = 16, seconds: float = 0.4, cpu_threads: int | None = None,
            pcie_repeat: int = 1, max_slots: int | None = None) -> BandwidthProfile:
    """Time the hybrid executor itself on one layer (`bank`, pinned, larger than the CPU's last-level
    cache), its calls queued back to back as decode queues them (one sync per batch, not per call;
    on CUDA timed on the device from a head start, so the launching thread's time is not counted):

    - each side alone, with 1 and `num_experts` misses per call ("offload": all over PCIe; "cpu":
      all on the CPU): a line through the two gives the side's fixed cost per call (the plan and
      fill's device latency; the hand-off to the CPU worker and back) and its rate alone;
    - both at once ("auto" with an even split of 2 x `num_experts` misses): how much each rate
      drops beside the other (they share host DRAM), as one factor on both alone rates.

    `seconds` per point. Experts rotate through half the bank each, so every call misses and the
    CPU reads from DRAM, not from a cache warmed by the previous call. `pcie_repeat`: the
    executor's emulation of a slower link, measured as it will run. The device holds one
    executor's slots at a time, as many as a call copies (n, at most `max_slots`: the cache the
    load plans, so a first load's measurement stays inside its VRAM budget), freed after."""
    device = torch.device(device)
    n = max(2, min(num_experts, bank.num_experts // 4, max_slots if max_slots is not None else num_experts))
    half, stride, layer = bank.num_experts // 2, bank.layout.expert_stride, bank.layer
    dtype = bank_dtype(bank)
    compute = torch.float32 if dtype == "f32" else torch.bfloat16
    hidden = bank.layout.part("w2").shape[0]
    turn = {"pcie": 0, "cpu": 0}

    def rotating(side: str, count: int) -> list[int]:
        start = turn[side]
        turn[side] = (start + count) % half
        return [(half if side == "cpu" else 0) + (start + i) % half for i in range(count)]

    def executor(mode: str, slots: int) -> HybridExpertExecutor:
        cache = ExpertCache(slots, stride, device, num_layers=layer + 1, num_experts=bank.num_experts)
        # uncaptured: a graph replay waits for its key's previous replay (decode_graphs.py), and every
        # call here has the same key, so the host could not run ahead of the device and the head start
        # would not hide its launches (profile version 5 charged a captured CPU share 0.28 ms a call for
        # ~0.1, and the fills 0.04-0.06 ms for ~0.015). In decode each layer has its own key.
        return HybridExpertExecutor({layer: bank}, device=device, cache=cache, mode=mode, cpu_executor=cpu_executor,
                                    compute_dtype=compute, prefill_buffers=0, split=lambda m, b: m // 2,
                                    auto_guard=False, pcie_repeat=pcie_repeat, cuda_graphs=False)

    x = torch.randn(1, hidden, dtype=compute, device=device)
    head_start = _HeadStart(device) if device.type == "cuda" else None

    def per_call_ms(ex: HybridExpertExecutor, pcie: int, cpu: int) -> float:
        """Median ms per call over batches of queued calls with `pcie` + `cpu` misses each."""
        count = pcie + cpu

        def batch(calls: int) -> float:
            if half < 2 * ex.cache.num_slots:  # a small bank: rotation alone would bring back cached experts
                ex.cache.clear()
            experts = [rotating("pcie", pcie) + rotating("cpu", cpu) for _ in range(calls)]
            ids = torch.tensor(experts, device=device).view(calls, 1, count)
            weights = torch.full((1, count), 1.0 / count, dtype=compute, device=device)
            _sync(device)
            if head_start is not None:
                return head_start.time(lambda: [ex(layer, x, ids[i], weights) for i in range(calls)]) / calls
            start = time.perf_counter()
            for i in range(calls):
                ex(layer, x, ids[i], weights)
            _sync(device)  # the device waited for every fill and CPU share
            return (time.perf_counter() - start) * 1e3 / calls

        batch(2)  # warm-up: kernels (a first launch loads its module: a host wait), staging buffers
        times, deadline = [], time.perf_counter() + seconds
        with torch.inference_mode():
            while time.perf_counter() < deadline or len(times) < 3:
                times.append(batch(8))
        return statistics.median(times)

    def timed(mode: str, slots: int, *calls: tuple[int, int]) -> list[float]:
        ex = executor(mode, slots)  # (n slots: a call's n PCIe misses, all victims, never a hit)
        try:
            return [per_call_ms(ex, pcie, cpu) for pcie, cpu in calls]
        finally:
            ex.close()

    pcie_points = timed("offload", n, (1, 0), (n, 0))
    cpu_points = timed("cpu", 0, (0, 1), (0, n))
    (together,) = timed("auto", n, (n, n))
    log.debug("bandwidth points, ms a call: PCIe 1 / %d misses %.3f / %.3f, CPU %.3f / %.3f, both %d + %d %.3f",
              n, *pcie_points, *cpu_points, n, n, together)
    pcie_fixed, pcie_per = _fit(*pcie_points, n)
    cpu_fixed, cpu_per = _fit(*cpu_points, n)
    if device.type == "cuda":
        torch.cuda.empty_cache()  # the measurement's slots back to the driver, not kept beside the cache
    # together = max(pcie_fixed + n * pcie_per / f, cpu_fixed + n * cpu_per / f): the slowdown f beside
    f = max(n * pcie_per / max(together - pcie_fixed, 1e-9), n * cpu_per / max(together - cpu_fixed, 1e-9))
    f = min(1.0, f)
    threads = cpu_threads or getattr(cpu_executor, "threads", None) or torch.get_num_threads()
    profile = BandwidthProfile(
        pcie_gbps=f * stride / (pcie_per * 1e6), cpu_gbps=f * stride / (cpu_per * 1e6), cpu_fixed_ms=cpu_fixed,
        pcie_fixed_ms=pcie_fixed, pcie_alone_gbps=stride / (pcie_per * 1e6), cpu_alone_gbps=stride / (cpu_per * 1e6),
        machine=machine_key(device, cpu_threads=threads, dtype=dtype, expert_bytes=stride, pcie_repeat=pcie_repeat),
        expert_bytes=stride,
        cpu_threads=threads, dtype=dtype, measured_at=time.strftime("%Y-%m-%dT%H:%M:%S"), version=PROFILE_VERSION)
    log.info("bandwidth profile %s: PCIe %.1f GB/s (alone %.1f) + %.3f ms, CPU %.1f GB/s (alone %.1f) + %.3f ms per "
             "layer call", profile.machine, profile.pcie_gbps, profile.pcie_alone_gbps, profile.pcie_fixed_ms,
             profile.cpu_gbps, profile.cpu_alone_gbps, profile.cpu_fixed_ms)
    return profile


class _HeadStart:
    """Times queued device work on the device, with the launching thread's time taken out: the
    device first spins for `ms` (torch.cuda._sleep), so the host has queued the whole batch
    before the device starts on it, and the batch is timed between two events after the spin.

    In decode the launching thread runs ahead of the device wherever misses cost more than
    launches (PCIe-bound budgets, where the split matters; where it does not, auto's guard times
    whole steps). Counted, the ~0.3-0.5 ms of launches of an uncaptured call made the CPU share's
    fixed cost look 0.3-0.7 ms a call on the H200 host, against ~0.09 ms for its pipeline.

    A batch whose queueing outlasted the spin (a host wait inside it, e.g. a kernel's first
    launch loading its module) counts the launches after the spin, as a wall clock would, and
    the spin doubles for the next (the caller takes medians)."""

    MAX_MS = 200.0

    def __init__(self, device: torch.device, ms: float = 10.0) -> None:
        self.device, self.ms = device, ms
        probe, start, end = 1 << 21, torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        for _ in range(2):  # the first also loads the spin kernel
            start.record()
            torch.cuda._sleep(probe)
            end.record()
            end.synchronize()
        self._cycles_per_ms = probe / max(start.elapsed_time(end), 1e-3)

    def time(self, queue: Callable[[], object]) -> float:
        """ms from the start of the work `queue` enqueues to its end (the device and every wait it
        makes, the CPU worker's included)."""
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        wall = time.perf_counter()  # the host's queueing time, against the spin
        torch.cuda._sleep(int(self.ms * self._cycles_per_ms))
        start.record()
        queue()
        end.record()
        if (time.perf_counter() - wall) * 1e3 > 0.8 * self.ms:
            self.ms = min(2 * self.ms, self.MAX_MS)
        _sync(self.device)
        return start.elapsed_time(end)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# A measurement in which both sides kept less than this share of their alone rates is not kept
# (an H100 race host of 2026-12-07: 0.11, so auto sent every miss over PCIe at -ncmoe 16, its CPU
# alone at 22.9 GB/s; 0.92-1.0 on every host before it, the CPU alone at 49-75): DRAM shared by the
# fills and the CPU kernel costs each side far less than that.
CONTENDED_FACTOR = 0.3


def load_or_measure(bank: HostExpertBank, cpu_executor: ExpertExecutor, device: torch.device | str, *,
                    cpu_threads: int | None = None, remeasure: bool = False, pcie_repeat: int = 1,
                    **kwargs) -> BandwidthProfile:
    """The kept profile of this machine, or a fresh measurement (then kept)."""
    threads = cpu_threads or getattr(cpu_executor, "threads", None) or torch.get_num_threads()
    key = machine_key(device, cpu_threads=threads, dtype=bank_dtype(bank), expert_bytes=bank.layout.expert_stride,
                      pcie_repeat=pcie_repeat)
    path = profiles_dir() / f"{key}.json"
    if path.exists() and not remeasure:
        try:
            kept = BandwidthProfile.load(path)
        except (OSError, ValueError, TypeError) as e:
            log.warning("bandwidth profile %s is unreadable (%s); measuring again", path, e)
        else:
            if kept.version == PROFILE_VERSION:
                return kept
            log.info("bandwidth profile %s is of version %d, not %d; measuring again", path, kept.version,
                     PROFILE_VERSION)
    profile = measure(bank, cpu_executor, device, cpu_threads=threads, pcie_repeat=pcie_repeat, **kwargs)
    if torch.device(device).type == "cuda" and profile.beside_factor < CONTENDED_FACTOR:
        # (kept, one measurement taken while other work held the cores would set auto's split for good)
        log.warning("bandwidth profile %s: with both sides running, each kept %.2f of its rate alone (PCIe %.1f of "
                    "%.1f GB/s, CPU %.1f of %.1f): auto sends misses over PCIe; other work may have held the CPU's "
                    "cores while it was measured (fewer --threads can help). Not kept: the next load measures again",
                    key, profile.beside_factor, profile.pcie_gbps, profile.pcie_alone_gbps, profile.cpu_gbps,
                    profile.cpu_alone_gbps)
        return profile
    profile.save(path)
    return profile


def _fit(one_ms: float, many_ms: float, many: int) -> tuple[float, float]:
    """(fixed ms, ms per expert) of a line through (1, one_ms) and (many, many_ms)."""
    per = (many_ms - one_ms) / (many - 1)
    if per <= 0:  # noise swamped the slope: all of it per expert
        return 0.0, many_ms / many
    return max(0.0, one_ms - per), per
