"""BandwidthProfile: how fast this machine serves a cache miss over PCIe and on the CPU.

Both rates are measured while both run (the copies and the CPU kernel share host DRAM), with
the runtime's own fill path and CPU kernel, at two batch sizes so each side's fixed per-call
cost comes apart from its per-expert cost. Profiles are kept as JSON under
$FT_HOME/profiles/<machine-key>.json and reloaded.
"""

from __future__ import annotations

import json
import logging
import os
import platform
import re
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from ..experts import ExpertExecutor, HostExpertBank
from .expert_cache import ExpertCache

log = logging.getLogger(__name__)

# Bumped when what is measured changes (2: fixed costs of the device-planned decode path with the
# CPU share awaited by the stream); a kept profile of another version is measured again.
PROFILE_VERSION = 2


@dataclass(frozen=True)
class BandwidthProfile:
    """Rates in GB/s of expert records while both sides run (they share host DRAM); fixed costs
    in ms per layer call that has any work. `*_alone_gbps`: each side with the other idle (0: the
    same as beside), which is what an all-PCIe or all-CPU layer gets."""

    pcie_gbps: float
    cpu_gbps: float
    cpu_fixed_ms: float
    pcie_fixed_ms: float
    pcie_alone_gbps: float = 0.0
    cpu_alone_gbps: float = 0.0
    machine: str = ""
    expert_bytes: int = 0  # the record size it was measured with
    cpu_threads: int = 0
    dtype: str = ""  # of the measured bank's weights
    measured_at: str = ""
    version: int = 0

    def save(self, path: Path) -> None:
        """Crash-safe: temp file, fsync, rename."""
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(asdict(self), f, indent=2)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)

    @staticmethod
    def load(path: Path) -> BandwidthProfile:
        data = json.loads(path.read_text(encoding="utf-8"))
        fields = BandwidthProfile.__dataclass_fields__
        return BandwidthProfile(**{k: v for k, v in data.items() if k in fields})


def profiles_dir() -> Path:
    home = os.environ.get("FT_HOME")
    return (Path(home) if home else Path.home() / ".ft") / "profiles"


def machine_key(device: torch.device | str, *, cpu_threads: int, dtype: str) -> str:
    """Host, accelerator, CPU threads and weight dtype: what the two rates depend on."""
    device = torch.device(device)
    accel = torch.cuda.get_device_name(device) if device.type == "cuda" else device.type
    raw = f"{platform.node() or 'host'}-{accel}-{cpu_threads}t-{dtype}"
    return re.sub(r"[^A-Za-z0-9._-]+", "_", raw)


def bank_dtype(bank: HostExpertBank) -> str:
    return "+".join(sorted({p.dtype for p in bank.layout.parts if not p.name.endswith("_scale")}))


def measure(bank: HostExpertBank, cpu_executor: ExpertExecutor, device: torch.device | str, *,
            num_experts: int = 16, seconds: float = 0.4, cpu_threads: int | None = None) -> BandwidthProfile:
    """Time the hybrid executor itself on one layer (`bank`, pinned, larger than the CPU's last-level
    cache) with 1 and `num_experts` misses per call: all over PCIe ("offload") while the CPU
    kernel streams other experts beside it, and all on the CPU ("cpu") while cache fills run
    beside it, `seconds` each. A line through each pair gives the side's fixed cost per call (end
    to end: planning, launches, the worker hand-off) and its rate under the other's load; the
    same without the other's load gives the rates alone."""
    from .executor import HybridExpertExecutor  # (it imports this module)

    device = torch.device(device)
    n = max(2, min(num_experts, bank.num_experts // 2))
    half, stride, layer = bank.num_experts // 2, bank.layout.expert_stride, bank.layer
    dtype = bank_dtype(bank)
    compute = torch.float32 if dtype == "f32" else torch.bfloat16
    hidden = bank.layout.part("w2").shape[0]
    turn = {"pcie": 0, "cpu": 0}

    def rotating(side: str, count: int) -> list[int]:
        # a new set of experts each call, from this side's half of the bank: the CPU reads from
        # DRAM as in decode, not from a last-level cache warmed by the previous call
        start = turn[side]
        turn[side] = (start + count) % half
        return [(half if side == "cpu" else 0) + (start + i) % half for i in range(count)]

    def executor(mode: str) -> HybridExpertExecutor:
        cache = ExpertCache(n, stride, device, num_layers=layer + 1, num_experts=bank.num_experts)
        return HybridExpertExecutor({layer: bank}, device=device, cache=cache, mode=mode, cpu_executor=cpu_executor,
                                    compute_dtype=compute, prefill_buffers=0)

    offload, on_cpu = executor("offload"), executor("cpu")
    x = torch.randn(1, hidden, dtype=compute, device=device)
    scratch = ExpertCache(n, stride, device, num_layers=layer + 1, num_experts=bank.num_experts)

    def hybrid_call(ex: HybridExpertExecutor, side: str, count: int) -> Callable[[], float]:
        def call() -> float:
            if half < 2 * n:  # a small bank: rotation alone would bring back cached experts
                ex.cache.clear()  # (a device sync and a re-upload: kept out of real-size measurements)
            ids = torch.tensor([rotating(side, count)], device=device)
            weights = torch.full((1, count), 1.0 / count, dtype=compute, device=device)
            start = time.perf_counter()
            ex(layer, x, ids, weights).cpu()  # waits for the compute stream, which waited for the fills
            return time.perf_counter() - start
        return call

    def cpu_load() -> None:
        ids = torch.tensor([rotating("cpu", n)])
        cpu_executor(layer, x.cpu(), ids, torch.full((1, n), 1.0 / n, dtype=compute))

    def pcie_load() -> None:
        experts = rotating("pcie", n)
        scratch.clear()
        events = scratch.fill([scratch.key(layer, e) for e in experts], list(range(n)),
                              [bank.record(e) for e in experts])
        if events and events[-1] is not None:
            events[-1].synchronize()  # this copy only: a device-wide sync would wait for the timed side

    try:
        timings = {(side, count, beside): _timed_beside(hybrid_call(ex, side, count), load if beside else None, seconds)
                   for side, ex, load in (("pcie", offload, cpu_load), ("cpu", on_cpu, pcie_load))
                   for count in (1, n) for beside in (True, False)}
    finally:
        offload.close()
        on_cpu.close()
    pcie_fixed, pcie_per = _fit(timings["pcie", 1, True], timings["pcie", n, True], n)
    cpu_fixed, cpu_per = _fit(timings["cpu", 1, True], timings["cpu", n, True], n)
    pcie_alone = _fit(timings["pcie", 1, False], timings["pcie", n, False], n)[1]
    cpu_alone = _fit(timings["cpu", 1, False], timings["cpu", n, False], n)[1]
    threads = cpu_threads or getattr(cpu_executor, "threads", None) or torch.get_num_threads()
    profile = BandwidthProfile(
        pcie_gbps=stride / (pcie_per * 1e6), cpu_gbps=stride / (cpu_per * 1e6), cpu_fixed_ms=cpu_fixed,
        pcie_fixed_ms=pcie_fixed, pcie_alone_gbps=stride / (pcie_alone * 1e6), cpu_alone_gbps=stride / (cpu_alone * 1e6),
        machine=machine_key(device, cpu_threads=threads, dtype=dtype), expert_bytes=stride,
        cpu_threads=threads, dtype=dtype, measured_at=time.strftime("%Y-%m-%dT%H:%M:%S"), version=PROFILE_VERSION)
    log.info("bandwidth profile %s: PCIe %.1f GB/s (alone %.1f) + %.3f ms, CPU %.1f GB/s (alone %.1f) + %.3f ms per "
             "layer call", profile.machine, profile.pcie_gbps, profile.pcie_alone_gbps, profile.pcie_fixed_ms,
             profile.cpu_gbps, profile.cpu_alone_gbps, profile.cpu_fixed_ms)
    return profile


def load_or_measure(bank: HostExpertBank, cpu_executor: ExpertExecutor, device: torch.device | str, *,
                    cpu_threads: int | None = None, remeasure: bool = False, **kwargs) -> BandwidthProfile:
    """The kept profile of this machine, or a fresh measurement (then kept)."""
    threads = cpu_threads or getattr(cpu_executor, "threads", None) or torch.get_num_threads()
    path = profiles_dir() / f"{machine_key(device, cpu_threads=threads, dtype=bank_dtype(bank))}.json"
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
    profile = measure(bank, cpu_executor, device, cpu_threads=threads, **kwargs)
    profile.save(path)
    return profile


def _timed_beside(timed: Callable[[], float], load: Callable[[], None] | None, seconds: float) -> float:
    """Median ms of `timed` (it returns its own seconds) over `seconds`, while `load` (if any)
    loops on a second thread; one warm-up call of each first."""
    timed()
    done = threading.Event()

    def background() -> None:
        with torch.inference_mode():
            while load is not None and not done.is_set():
                load()

    worker = threading.Thread(target=background, name="ft-profile-load")
    worker.start()
    times: list[float] = []
    deadline = time.perf_counter() + seconds
    try:
        with torch.inference_mode():
            while time.perf_counter() < deadline or not times:
                times.append(timed() * 1e3)
    finally:
        done.set()
        worker.join()
    return statistics.median(times)


def _fit(one_ms: float, many_ms: float, many: int) -> tuple[float, float]:
    """(fixed ms, ms per expert) of a line through (1, one_ms) and (many, many_ms)."""
    per = (many_ms - one_ms) / (many - 1)
    if per <= 0:  # noise swamped the slope: all of it per expert
        return 0.0, many_ms / many
    return max(0.0, one_ms - per), per
