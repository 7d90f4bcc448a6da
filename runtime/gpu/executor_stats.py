"""What the hybrid executor counts: ExpertStats (the counters `stats()` returns), DeviceCounts
(the route plan's running sums on the device, behind them) and RecentHitRate (the decayed hit
rate that prices "auto"'s CPU-served misses)."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import asdict, dataclass

import torch

from ..policy.expert_cache import HIT_RATE_DECAY
from ..policy.miss_split import fill_worth
from .kernels import HIT, NUM_COUNTS, NUM_UNIQUE, RANKED, TAIL


@dataclass
class ExpertStats:
    """Counters since the last reset; experts are counted once per layer call (deduplicated)."""

    calls: int = 0  # layer calls on the decode path
    tokens: int = 0
    hits: int = 0
    misses: int = 0
    pcie_experts: int = 0
    pcie_bytes: int = 0
    cpu_experts: int = 0
    cpu_bytes: int = 0
    prefill_calls: int = 0  # layer calls that streamed the bank
    prefill_tokens: int = 0
    prefill_bytes: int = 0
    prefill_experts_skipped: int = 0  # read from the cache instead of streamed
    decode_ms: float = 0.0  # wall time of decode-path calls (the host side; the device may lag)
    prefill_ms: float = 0.0
    cpu_ms: float = 0.0  # the CPU kernel's time on the worker thread
    cpu_wait_ms: float = 0.0  # how long calls waited for the CPU after queueing the device work

    @property
    def hit_rate(self) -> float:
        return self.hits / (self.hits + self.misses) if self.hits + self.misses else 0.0

    def as_dict(self) -> dict[str, float]:
        return {**asdict(self), "hit_rate": self.hit_rate}


class DeviceCounts:
    """The route plan's running sums of its counts (hits, pcie, cpu, unique, ranked and tail hits) on
    the device, one int64 [NUM_COUNTS] per expert size (a miss costs its size's bytes): added to by
    every decode call with no host sync, read back only when asked."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._by_stride: dict[int, torch.Tensor] = {}

    def of(self, stride: int) -> torch.Tensor:
        """The sums for experts of `stride` bytes, made (zeros) on first use."""
        totals = self._by_stride.get(stride)
        if totals is None:
            totals = self._by_stride[stride] = torch.zeros(NUM_COUNTS, dtype=torch.int64, device=self.device)
        return totals

    def made(self, stride: int) -> torch.Tensor | None:
        """The sums for `stride`, or None before a call has made them (a CUDA graph capture may not)."""
        return self._by_stride.get(stride)

    def all(self) -> Collection[torch.Tensor]:
        return self._by_stride.values()

    def cpu_experts(self) -> int:
        """Misses served by the CPU so far (a device read)."""
        return int(sum(int(totals[2]) for totals in self._by_stride.values()))

    def add_to(self, stats: ExpertStats) -> None:
        """Add the sums to `stats`' expert counters (one device read per size)."""
        for stride, totals in self._by_stride.items():
            hits, pcie, cpu = totals.tolist()[:3]
            stats.hits, stats.misses = stats.hits + hits, stats.misses + pcie + cpu
            stats.pcie_experts, stats.pcie_bytes = stats.pcie_experts + pcie, stats.pcie_bytes + pcie * stride
            stats.cpu_experts, stats.cpu_bytes = stats.cpu_experts + cpu, stats.cpu_bytes + cpu * stride

    def zero(self) -> None:
        for totals in self._by_stride.values():
            totals.zero_()


class RecentHitRate:
    """Hits over reads (distinct experts) of decode layer calls, both decayed by HIT_RATE_DECAY
    per call: the trace simulator's measure; and beside them the sampled hits' LRU ranks (ranked,
    and of those in the oldest quarter), decayed alike, for what a copy is worth (`fill_worth`).
    Off CUDA it is exact, call by call. On CUDA the route plan sums the counts on the device;
    every WINDOW calls those running sums are copied to pinned memory without a sync (an event
    polled later) and the block of w calls since the last copy is folded in as decay^w * old +
    block, so the value lags by one or two windows (up to 128 calls against the ~1000 the decay
    looks back over; each read-back costs the host ~25 us, which a smaller window would spend on
    the decode path)."""

    WINDOW = 64
    KEPT = (HIT, NUM_UNIQUE, RANKED, TAIL)  # the counts folded in: hits, reads, ranked, tail

    def __init__(self, device: torch.device) -> None:
        self.sums = [0.0] * len(self.KEPT)  # decayed, in KEPT's order
        self.is_cuda = device.type == "cuda"
        if self.is_cuda:
            # the running sums, all of them: one copy of a device view. (An index of KEPT made on the device
            # here was a host-to-device copy from pageable memory, which waits for the stream, and the
            # stream was waiting for the CPU share's hand-off from this thread: a hang, on the H200.)
            self._host = torch.zeros(NUM_COUNTS, dtype=torch.int64, device="cpu").pin_memory()
            # the strides' sums added up in place: an allocation here, made while the stream waits on the
            # next step's doorbell, can free cached blocks, and cudaFree waits for the device (a hang)
            self._device_sums = torch.zeros(NUM_COUNTS, dtype=torch.int64, device=device)
            self._event: torch.cuda.Event | None = None
            self._last = [0] * len(self.KEPT)
            self._calls = self._calls_in_flight = 0

    @property
    def value(self) -> float:
        hits, reads = self.sums[0], self.sums[1]
        return hits / reads if reads else 0.0

    @property
    def fill_worth(self) -> float:
        """What a copy is worth now: the hit rate less the victim's share (miss_split.fill_worth)."""
        return fill_worth(self.value, self.sums[2], self.sums[3])

    def _fold(self, block: list[int], calls: int) -> None:
        decay = HIT_RATE_DECAY ** calls
        self.sums = [decay * old + new for old, new in zip(self.sums, block, strict=True)]

    def _sum_on_device(self, totals: Collection[torch.Tensor]) -> torch.Tensor:
        """The running sums of every stride, added up without allocating."""
        first, *rest = totals
        if not rest:
            return first
        self._device_sums.copy_(first)
        for more in rest:
            self._device_sums.add_(more)
        return self._device_sums

    def observe(self, counts: torch.Tensor | None, totals: Collection[torch.Tensor], calls: int = 1) -> None:
        """One decode call: its plan's `counts` (read off CUDA), and the device's running sums
        `totals` [NUM_COUNTS] each (read back on CUDA); or, on CUDA, `calls` calls at once (a
        captured step's)."""
        if not self.is_cuda:
            assert counts is not None and calls == 1
            self._fold([int(counts[i]) for i in self.KEPT], 1)
            return
        self._calls += calls
        if self._calls < self.WINDOW or (self._event is not None and not self._event.query()):
            return
        if self._event is not None:
            host = self._host.tolist()
            now = [host[i] for i in self.KEPT]
            if any(a < b for a, b in zip(now, self._last, strict=True)):  # the sums were reset (reset_stats)
                self._last = [0] * len(self.KEPT)
            self._fold([a - b for a, b in zip(now, self._last, strict=True)], self._calls_in_flight)
            self._last = now
        self._host.copy_(self._sum_on_device(totals), non_blocking=True)
        self._event = torch.cuda.Event()
        self._event.record()
        self._calls_in_flight, self._calls = self._calls, 0
