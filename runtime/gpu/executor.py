"""HybridExpertExecutor: the routed experts of one MoE layer, from the device cache, over PCIe, or on
the CPU, in the split the mode (and for "auto", the measured bandwidths) decide.

One decode call: dedup the routed experts, classify hits and misses against the cache's table,
send the first n_pcie misses over PCIe into LRU victim slots (never a slot the layer needs) and
run them on the device from there, and run the rest on the CPU straight from the host bank on a
worker thread while the device works; the CPU result is added on the device. A call with many
tokens (prefill) streams the whole bank instead (prefill.py).

Modes (how many misses cross PCIe): "offload" all; "cpu" none; "static" none, with whole layers
resident from the start (llama.cpp's static split); "prefill_placement" none, the cache placed
by each prefill's routing counts; "auto" the count the one cost model (cache_policy_split.py,
through split.py) gives for the measured BandwidthProfile, each CPU-served miss charged the later
miss it causes at the cache's recent hit rate, as the trace simulator's `automatic` policy does.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, replace

import torch

from ..cache_policy import HIT_RATE_DECAY
from ..cache_policy_split import choose_pcie_misses, fill_value_seconds
from ..experts import CPUExpertExecutor, ExpertExecutor, HostExpertBank
from .expert_cache import ExpertCache
from .prefill import StreamingPrefill
from .profile import BandwidthProfile
from .records import PairPlan, check_device_layout, experts_from_records
from .split import miss_cost

log = logging.getLogger(__name__)

MODES = ("auto", "offload", "cpu", "static", "prefill_placement")
PLACEMENT = {"auto": "lru", "offload": "lru", "static": "none", "prefill_placement": "hot", "cpu": "none"}
Split = Callable[[int, int], int]  # (number of misses, bytes per expert) -> how many cross PCIe


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


class HybridExpertExecutor:
    """An ExpertExecutor over host banks (pinned on CUDA) and a device ExpertCache.

    `cpu_executor` runs the CPU share (default: CPUExpertExecutor over the same banks);
    `compute_dtype` is the device compute dtype; `profile` feeds "auto" (or pass `split`, any
    (misses, expert_bytes) -> count function, e.g. a cache-policy chooser). The recent hit rate
    that prices a CPU-served miss is the simulator's: hits over distinct experts of decode layer
    calls, both decayed by HIT_RATE_DECAY per call (an exponential moving average, 0 before any). "static" keeps
    `static_resident_layers` (default: as many whole layers as fit, first ones first) resident.
    Calls with at least `prefill_min_tokens` tokens stream whole banks through `prefill_buffers`
    (2: double-buffered, 1: single, 0: never) bank-sized device buffers.
    """

    def __init__(self, banks: dict[int, HostExpertBank], *, device: torch.device | str, cache: ExpertCache,
                 mode: str = "auto", cpu_executor: ExpertExecutor | None = None,
                 compute_dtype: torch.dtype = torch.bfloat16, profile: BandwidthProfile | None = None,
                 static_resident_layers: Sequence[int] | None = None, split: Split | None = None,
                 prefill_min_tokens: int = 32, prefill_buffers: int = 2) -> None:
        if mode not in MODES:
            raise ValueError(f"mode is one of {', '.join(MODES)}, not {mode!r}")
        if mode == "auto" and split is None and profile is None:
            raise ValueError("mode 'auto' needs a BandwidthProfile (runtime.gpu.profile.load_or_measure) or a split")
        self.banks, self.device, self.cache, self.mode = banks, torch.device(device), cache, mode
        for bank in banks.values():
            if mode != "cpu":
                check_device_layout(bank.layout)
            if bank.layout.expert_stride > cache.slot_bytes or bank.layer >= cache.num_layers \
                    or bank.num_experts > cache.num_experts:
                raise ValueError(f"layer {bank.layer} ({bank.num_experts} experts of {bank.layout.expert_stride} "
                                 f"bytes) does not fit the cache's keys or slots")
        self.compute_dtype = compute_dtype
        self.cpu_executor = cpu_executor or CPUExpertExecutor(banks, compute_dtype)
        self.profile = profile
        self._cost = miss_cost(profile) if profile is not None else None
        self.split = split or (self._profile_split if mode == "auto" else None)
        self._recent_hits = self._recent_reads = 0.0
        self.prefill_min_tokens = prefill_min_tokens
        self.prefill = (StreamingPrefill(banks, cache, compute_dtype, num_buffers=prefill_buffers,
                                         placement=PLACEMENT[mode])
                        if prefill_buffers and mode != "cpu" else None)
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="ft-cpu-experts")
        self._stats = ExpertStats()
        self._static_request = static_resident_layers
        self.resident_layers: tuple[int, ...] = ()
        if mode == "static":
            self._make_resident()

    # -- the ExpertExecutor call ---------------------------------------------------------------------

    def __call__(self, layer: int, x: torch.Tensor, expert_ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        # Host tensors here name device="cpu": inside DeviceModel, torch's default device is the GPU.
        start = time.perf_counter()
        if self.prefill is not None and x.shape[0] >= self.prefill_min_tokens:
            streamed, skipped = self.prefill.streamer.bytes_streamed, self.prefill.streamer.experts_skipped
            out = self.prefill(layer, x, expert_ids, weights)
            s = self._stats
            s.prefill_calls, s.prefill_tokens = s.prefill_calls + 1, s.prefill_tokens + x.shape[0]
            s.prefill_bytes += self.prefill.streamer.bytes_streamed - streamed
            s.prefill_experts_skipped += self.prefill.streamer.experts_skipped - skipped
            s.prefill_ms += (time.perf_counter() - start) * 1e3
            return out
        out = self._decode(layer, x, expert_ids, weights)
        self._stats.decode_ms += (time.perf_counter() - start) * 1e3
        return out

    def _decode(self, layer: int, x: torch.Tensor, expert_ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        bank, cache, streams = self.banks[layer], self.cache, self.cache.streams
        stride = bank.layout.expert_stride
        # the layer's one host sync: copies are planned on the host (x and weights come along for the CPU)
        ids, x_host, weights_host = streams.download(expert_ids, x, weights)
        ids = ids.to(torch.int64)
        counts = Counter(ids.reshape(-1).tolist())
        needed = sorted(counts, key=lambda e: (-counts[e], e))  # the most used experts first
        keys = [cache.key(layer, e) for e in needed]
        cache.advance()
        slots = cache.lookup(keys)
        hits = {e: s for e, s in zip(needed, slots, strict=True) if s >= 0}
        misses = [e for e, s in zip(needed, slots, strict=True) if s < 0]
        cache.touch(list(hits.values()))
        num_pcie = min(self._pcie_count(len(misses), stride), cache.num_evictable(keys)) if misses else 0
        self._recent_hits = HIT_RATE_DECAY * self._recent_hits + len(hits)
        self._recent_reads = HIT_RATE_DECAY * self._recent_reads + len(needed)
        to_pcie, to_cpu = misses[:num_pcie], misses[num_pcie:]

        future = self._submit_cpu(layer, x_host, ids, weights_host, to_cpu) if to_cpu else None
        out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
        if hits:
            self._device_experts(x, ids, weights, hits, bank, out)
        if to_pcie:
            victims = cache.victims(num_pcie, keys)
            events = cache.fill([cache.key(layer, e) for e in to_pcie], victims, [bank.record(e) for e in to_pcie])
            self._device_experts(x, ids, weights, dict(zip(to_pcie, victims, strict=True)), bank, out, events)
        if future is not None:
            waited = time.perf_counter()
            out += streams.upload(future.result()).to(torch.float32)
            self._stats.cpu_wait_ms += (time.perf_counter() - waited) * 1e3

        s = self._stats
        s.calls, s.tokens, s.hits, s.misses = s.calls + 1, s.tokens + x.shape[0], s.hits + len(hits), s.misses + len(misses)
        s.pcie_experts, s.pcie_bytes = s.pcie_experts + num_pcie, s.pcie_bytes + num_pcie * stride
        s.cpu_experts, s.cpu_bytes = s.cpu_experts + len(to_cpu), s.cpu_bytes + len(to_cpu) * stride
        return out.to(x.dtype)

    @property
    def recent_hit_rate(self) -> float:
        """Decode hits over reads, decayed by HIT_RATE_DECAY per layer call (GlobalLRU's measure)."""
        return self._recent_hits / self._recent_reads if self._recent_reads else 0.0

    def _profile_split(self, num_misses: int, expert_bytes: int) -> int:
        """The "auto" count from the profile, CPU-served misses charged their expected re-miss."""
        assert self._cost is not None
        fill_value_s = fill_value_seconds(self.recent_hit_rate, expert_bytes, self._cost)
        return choose_pcie_misses(num_misses, expert_bytes, self._cost, fill_value_s)

    def _pcie_count(self, num_misses: int, expert_bytes: int) -> int:
        if self.mode == "offload":
            return num_misses
        if self.mode == "auto" and self.split is not None:
            return max(0, min(num_misses, self.split(num_misses, expert_bytes)))
        return 0

    def _device_experts(self, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor, rows: dict[int, int],
                        bank: HostExpertBank, out: torch.Tensor, events: Sequence = ()) -> None:
        """Add the pairs routed to `rows` (expert -> slot) to `out`, computed from the slots once
        `events` (their fills) are done; nothing here waits on the host."""
        row_of = torch.full((bank.num_experts,), -1, dtype=torch.int64, device="cpu")
        row_of[torch.tensor(list(rows), device="cpu")] = torch.tensor(list(rows.values()), device="cpu")
        plan = PairPlan.build(ids, row_of, self.cache.streams.upload)
        for event in events:
            self.cache.streams.wait(event)
        if plan is not None:
            experts_from_records(x, weights, plan, self.cache.views(bank.layout), self.compute_dtype, out)

    def _submit_cpu(self, layer: int, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor,
                    experts: list[int]) -> Future:
        """Queue the pairs routed to `experts` on the CPU worker (x, ids, weights on the host)."""
        mask = torch.isin(ids, torch.tensor(experts, device="cpu"))  # [T, K]
        width = int(mask.sum(dim=1).max())
        order = torch.argsort((~mask).to(torch.int8), dim=1, stable=True)[:, :width]  # CPU pairs first
        keep = mask.gather(1, order)
        # padding (tokens with fewer CPU pairs): an expert the kernel streams anyway, weight 0
        cpu_ids = torch.where(keep, ids.gather(1, order), experts[0])
        cpu_weights = weights.gather(1, order) * keep
        return self._pool.submit(self._run_cpu, layer, x, cpu_ids, cpu_weights)

    def _run_cpu(self, layer: int, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        start = time.perf_counter()
        with torch.inference_mode():  # a worker thread: no device context, no autograd
            y = self.cpu_executor(layer, x, ids, weights)
        self._stats.cpu_ms += (time.perf_counter() - start) * 1e3
        return y

    # -- residency, size, stats ----------------------------------------------------------------------

    def _make_resident(self) -> None:
        """Static split: whole layers resident (pinned slots), filled once from the host banks."""
        cache = self.cache
        cache.clear()
        layers = sorted(self.banks)
        if self._static_request is None:
            chosen, room = [], cache.num_slots
            for layer in layers:
                if self.banks[layer].num_experts > room:
                    break
                chosen.append(layer)
                room -= self.banks[layer].num_experts
        else:
            chosen = sorted(self._static_request)
            unknown = [layer for layer in chosen if layer not in self.banks]
            need = sum(self.banks[layer].num_experts for layer in chosen if layer in self.banks)
            if unknown or need > cache.num_slots:
                raise ValueError(f"static residency of layers {chosen}: unknown MoE layers {unknown}, or "
                                 f"{need} experts for {cache.num_slots} slots")
        for layer in chosen:
            bank = self.banks[layer]
            keys = [cache.key(layer, e) for e in range(bank.num_experts)]
            victims = cache.victims(len(keys))
            cache.fill(keys, victims, [bank.record(e) for e in range(bank.num_experts)])
            cache.pinned[victims] = True
        cache.streams.synchronize()
        self.resident_layers = tuple(chosen)
        log.info("static split: layers %s resident (%d of %d slots)", chosen, int(cache.pinned.sum()), cache.num_slots)

    def _record(self, key: int) -> torch.Tensor:
        layer, expert = divmod(key, self.cache.num_experts)
        return self.banks[layer].record(expert)

    def resize(self, num_slots: int) -> None:
        """Elastic VRAM: rebuild the cache with `num_slots` slots between steps (the most recently
        used entries that fit stay); no weights are reloaded. Static mode re-places its layers."""
        if self.prefill is not None:
            self.prefill.streamer.release()  # a prefetched bank may read slots that move
        self.cache.resize(num_slots, source=self._record)
        if self.mode == "static":
            self._make_resident()

    def clear(self) -> None:
        self.cache.clear()
        if self.mode == "static":
            self._make_resident()

    def stats(self) -> ExpertStats:
        return replace(self._stats)

    def reset_stats(self) -> None:
        self._stats = ExpertStats()

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        if self.prefill is not None:
            self.prefill.streamer.release()
