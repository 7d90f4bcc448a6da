"""Expert-cache policies (DESIGN.md §5), as plain simulators: which (layer, expert) pairs sit in
the GPU's expert cache, and how each miss is served. No torch, no GPU; the mechanism that moves
the bytes lives in runtime/gpu/ and asks these objects what to do.

A policy is fed one layer step at a time: `access(layer, experts) -> (hits, misses)`, where
`experts` are that token's top-k ids for the layer (duplicates and -1 ignored). It keeps counters
(`reads`, `hits`, `misses`, and of the misses `pcie_fills` copied into the cache and `cpu_misses`
computed on the CPU). `replay(policy, trace)` loads the cache, passes the prompt through it, then
counts the decode tokens into a `ReplayResult`.

    GlobalLRU          one LRU over (layer, expert) for all layers; `split` says how many of a
                       layer's misses go over PCIe into victim slots (None: all = `offload_only`;
                       `automatic`: the q* chooser; `cpu_only_misses`: none, the cache stays as loaded)
    StaticLayerSplit   whole layers resident, in layer order (llama.cpp's --n-cpu-moe); the rest miss
    PrefillPlacement   the prompt's hottest pairs, fixed for the whole decode; misses on the CPU

References to measure against live in cache_policy_reference.py: LFU, and Belady's offline optimum.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from .miss_split import (
    FILL_PRICING,
    MissCost,
    choose_pcie_misses,
    fill_value_seconds,
    fill_worth,
    finish_seconds,
    naive_pcie_misses,
    rank_sampled,
)
from .trace import RoutingTrace, Schedule

Key = tuple[int, int]  # (layer, expert)
Split = Callable[[int, int, float], int]  # (layer, misses, what a copy is worth) -> how many to copy into the cache
HIT_RATE_DECAY = 0.999  # per counted step: the recent hit rate looks back ~1000 layer steps (~20 tokens)


def distinct(experts: Iterable[int]) -> list[int]:
    """The ids a layer step needs, once each, in router rank order; -1 (absent) dropped."""
    return [e for e in dict.fromkeys(int(x) for x in experts) if e >= 0]


class CachePolicy(ABC):
    """The interface every policy implements. Counters count `access` calls only, never `warm`."""

    name = "policy"

    def __init__(self, capacity_slots: int) -> None:
        if capacity_slots < 0:
            raise ValueError(f"capacity_slots must be >= 0, not {capacity_slots}")
        self.capacity_slots = capacity_slots
        self.reset_counters()

    def reset_counters(self) -> None:
        self.reads = self.hits = self.misses = self.pcie_fills = self.cpu_misses = 0

    def prepare(self, schedule: Schedule) -> None:  # noqa: B027 - a hook, most policies need nothing
        """Called once before the prompt: offline policies read the future, placements the prompt."""

    def warm(self, layer: int, experts: Sequence[int]) -> None:
        """The prompt passes through: fill as the prefill would, without counting."""
        self._step(layer, distinct(experts), warm=True)

    def access(self, layer: int, experts: Sequence[int]) -> tuple[int, int]:
        """One decode layer step: returns (hits, misses) over its distinct experts."""
        hits, pcie, cpu = self._step(layer, distinct(experts), warm=False)
        self.reads += hits + pcie + cpu
        self.hits += hits
        self.misses += pcie + cpu
        self.pcie_fills += pcie
        self.cpu_misses += cpu
        return hits, pcie + cpu

    @abstractmethod
    def _step(self, layer: int, ids: list[int], warm: bool) -> tuple[int, int, int]:
        """(hits, misses copied over PCIe, misses computed on the CPU) for distinct `ids`."""

    @abstractmethod
    def resident(self) -> set[Key]:
        """The (layer, expert) pairs in the cache now."""


class GlobalLRU(CachePolicy):
    """One LRU over (layer, expert) shared by all layers. Hits refresh recency; misses copied over
    PCIe take the least recently used slots. An expert the current step needs is never a victim
    (they were all just refreshed); a fill that finds no other victim is served without caching.

    `capacity_slots` counts slots; with `sizes` (bytes of one expert per layer) it counts bytes and
    an expert of layer l takes sizes[l] of it (the trace repository's byte-budgeted simulator).
    `split(layer, misses, price)` -> how many misses to copy (the first ones in rank order); None:
    all. `price` is what a copy is worth (`fill_price`): the recent hit rate (decayed by
    HIT_RATE_DECAY per step, 0 before any), or with `pricing` "worth" `fill_worth`, that less the
    victim's share, from the hits' LRU ranks that `rank_hits` samples as the GPU's route plan does
    (route_plan_ref step 6: the same calls, by the same clock, one per layer step)."""

    def __init__(self, capacity_slots: int, *, sizes: Sequence[int] | None = None, split: Split | None = None,
                 name: str = "lru", rank_hits: bool = False, pricing: str = "hit_rate") -> None:
        super().__init__(capacity_slots)
        if pricing not in FILL_PRICING:
            raise ValueError(f"pricing is one of {', '.join(FILL_PRICING)}, not {pricing!r}")
        self.name, self.split, self.pricing = name, split, pricing
        self.rank_hits = rank_hits or pricing == "worth"
        self.sizes = None if sizes is None else [int(s) for s in sizes]
        self._slots: OrderedDict[Key, int] = OrderedDict()  # key -> size, least recent first
        self._used = 0
        self._recent_hits = self._recent_reads = self._recent_ranked = self._recent_tail = 0.0
        self._clock = 0  # moved on by every layer step, as the GPU cache's is by every layer call
        self._stamps: dict[Key, int] = {}  # with rank_hits: the clock each cached key was last used at

    @property
    def recent_hit_rate(self) -> float:
        return self._recent_hits / self._recent_reads if self._recent_reads else 0.0

    @property
    def fill_worth(self) -> float:
        """What a copy is worth now (miss_split.fill_worth; the hit rate where nothing is ranked)."""
        return fill_worth(self.recent_hit_rate, self._recent_ranked, self._recent_tail)

    @property
    def fill_price(self) -> float:
        """What `split` is given: the recent hit rate, or with pricing "worth" `fill_worth`."""
        return self.fill_worth if self.pricing == "worth" else self.recent_hit_rate

    def _ranks(self, hits: list[Key]) -> tuple[int, int]:
        """(ranked, in the oldest quarter) of this step's hits, ranked before they are refreshed:
        route_plan_ref step 6 (newer = cached keys used strictly later)."""
        stamps = np.fromiter(self._stamps.values(), dtype=np.int64, count=len(self._stamps))
        tail = sum(4 * int((stamps > self._stamps[k]).sum()) >= 3 * len(stamps) for k in hits)
        return len(hits), tail

    def _step(self, layer: int, ids: list[int], warm: bool) -> tuple[int, int, int]:
        self._clock += 1
        hits = [(layer, e) for e in ids if (layer, e) in self._slots]
        ranked, tail = self._ranks(hits) if self.rank_hits and hits and rank_sampled(self._clock) else (0, 0)
        missing = []
        for e in ids:
            if (layer, e) in self._slots:
                self._slots.move_to_end((layer, e))
                if self.rank_hits:
                    self._stamps[layer, e] = self._clock
            else:
                missing.append(e)
        if warm:
            copies = len(missing)
        else:
            copies = len(missing) if self.split is None else self.split(layer, len(missing), self.fill_price)
            self._recent_hits = HIT_RATE_DECAY * self._recent_hits + len(ids) - len(missing)
            self._recent_reads = HIT_RATE_DECAY * self._recent_reads + len(ids)
            self._recent_ranked = HIT_RATE_DECAY * self._recent_ranked + ranked
            self._recent_tail = HIT_RATE_DECAY * self._recent_tail + tail
        assert 0 <= copies <= len(missing), (copies, len(missing))
        needed = {(layer, e) for e in ids}
        for e in missing[:copies]:
            self._insert((layer, e), needed)
        return len(ids) - len(missing), copies, len(missing) - copies

    def _insert(self, key: Key, needed: set[Key]) -> None:
        size = 1 if self.sizes is None else self.sizes[key[0]]
        while self._used + size > self.capacity_slots:
            victim = next(iter(self._slots), None)
            if victim is None or victim in needed:  # what is left is all needed now: no room
                return
            self._used -= self._slots.pop(victim)
            self._stamps.pop(victim, None)
        self._slots[key] = size
        self._used += size
        if self.rank_hits:
            self._stamps[key] = self._clock

    def resident(self) -> set[Key]:
        return set(self._slots)

    def lru_order(self) -> list[Key]:
        """Cached pairs, the next victim first."""
        return list(self._slots)


def offload_only(capacity_slots: int, **kw: object) -> GlobalLRU:
    """Every miss is copied over PCIe into the cache and computed on the GPU."""
    return GlobalLRU(capacity_slots, name="offload-only", **kw)  # type: ignore[arg-type]


def cpu_only_misses(capacity_slots: int) -> GlobalLRU:
    """Every miss is computed on the CPU; the cache keeps what the load and the prompt left in it."""
    return GlobalLRU(capacity_slots, split=lambda layer, misses, worth: 0, name="cpu-misses")


def automatic(capacity_slots: int, cost: MissCost, expert_bytes: Sequence[int],
              pricing: str = "hit_rate") -> GlobalLRU:
    """Global LRU + the q* split of each layer's misses (`choose_pcie_misses`), each CPU-served miss
    charged the later miss it causes (`fill_value_seconds`) at the recent hit rate, or with `pricing`
    "worth" at what a copy is worth (`fill_worth`: the hits' LRU ranks sampled, as the GPU's are)."""
    sizes = [int(b) for b in expert_bytes]

    def split(layer: int, misses: int, price: float) -> int:
        value = fill_value_seconds(price, sizes[layer], cost)
        return choose_pcie_misses(misses, sizes[layer], cost, fill_value_s=value)

    # (its hits ranked whatever the pricing, as the route plan ranks them: `fill_worth` is comparable)
    return GlobalLRU(capacity_slots, split=split, name="automatic" if pricing == "hit_rate" else "automatic, worth",
                     rank_hits=True, pricing=pricing)


def per_step_split(capacity_slots: int, cost: MissCost, expert_bytes: Sequence[int]) -> GlobalLRU:
    """Global LRU + the q* split that minimises each step alone (no charge for not caching)."""
    sizes = [int(b) for b in expert_bytes]
    return GlobalLRU(capacity_slots, split=lambda layer, misses, worth: choose_pcie_misses(misses, sizes[layer], cost),
                     name="per-step-split")


def naive_hybrid(capacity_slots: int, cost: MissCost) -> GlobalLRU:
    """Global LRU + round(m p/(p+c)) copied: the ratio without the miss count's fixed costs."""
    return GlobalLRU(capacity_slots, split=lambda layer, misses, worth: naive_pcie_misses(misses, cost),
                     name="naive-hybrid")


class StaticLayerSplit(CachePolicy):
    """As many whole layers as fit stay resident (layer order; `from_end` for the last layers, which
    is what llama.cpp's --n-cpu-moe N does: the first N layers' experts on the CPU). Every read of
    another layer misses and runs on the CPU. Miss rate = 1 - resident layers / L either way."""

    def __init__(self, capacity_slots: int, num_experts: int, *, num_layers: int | None = None,
                 from_end: bool = False, name: str = "static-split") -> None:
        super().__init__(capacity_slots)
        self.name, self.num_experts, self.num_layers, self.from_end = name, num_experts, num_layers, from_end
        self.num_resident_layers = capacity_slots // num_experts

    def prepare(self, schedule: Schedule) -> None:
        self.num_layers = self.num_layers or schedule.num_layers

    @property
    def resident_layers(self) -> range:
        n = self.num_resident_layers
        if not self.from_end:
            return range(n)
        assert self.num_layers is not None, "from_end needs num_layers"
        return range(max(self.num_layers - n, 0), self.num_layers)

    def _step(self, layer: int, ids: list[int], warm: bool) -> tuple[int, int, int]:
        return (len(ids), 0, 0) if layer in self.resident_layers else (0, 0, len(ids))

    def resident(self) -> set[Key]:
        return {(layer, e) for layer in self.resident_layers for e in range(self.num_experts)}


class PrefillPlacement(CachePolicy):
    """At prefill, the pairs the prompt used most are placed (ties: lower layer, lower id) and stay
    for the whole decode; misses run on the CPU. Capacity beyond the prompt's pairs takes unused
    ones round-robin over layers (lowest id first), so no slot is left empty."""

    def __init__(self, capacity_slots: int, counts: dict[Key, int] | None = None, *, num_layers: int | None = None,
                 num_experts: int | None = None, name: str = "prefill-placement") -> None:
        super().__init__(capacity_slots)
        self.name, self._placed = name, set()
        if counts is not None:
            assert num_layers is not None and num_experts is not None
            self.place(counts, num_layers, num_experts)
        self._given = counts is not None

    def place(self, counts: dict[Key, int], num_layers: int, num_experts: int) -> None:
        hot = sorted((k for k, c in counts.items() if c > 0), key=lambda k: (-counts[k], k))
        rest = sorted(((layer, e) for layer in range(num_layers) for e in range(num_experts)
                       if counts.get((layer, e), 0) <= 0), key=lambda k: (k[1], k[0]))
        self._placed = set((hot + rest)[: self.capacity_slots])

    def prepare(self, schedule: Schedule) -> None:
        if not self._given:
            self.place(schedule.prefill_counts, schedule.num_layers, schedule.num_experts)

    def _step(self, layer: int, ids: list[int], warm: bool) -> tuple[int, int, int]:
        hits = sum((layer, e) in self._placed for e in ids)
        return hits, 0, len(ids) - hits

    def resident(self) -> set[Key]:
        return set(self._placed)


# -- replay -----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ReplayResult:
    """What one policy did over a trace's decode tokens. Bytes use the trace's `expert_bytes`."""

    policy: str
    capacity_slots: int
    num_tokens: int
    reads: int  # decode expert reads: distinct experts per (token, layer)
    hits: int
    misses: int
    pcie_fills: int
    cpu_misses: int
    pcie_bytes: int
    cpu_bytes: int
    miss_seconds: float | None  # modelled time serving misses (sum of per-layer finish times), if a cost was given

    @property
    def miss_rate(self) -> float:
        return self.misses / self.reads if self.reads else 0.0

    @property
    def pcie_mb_per_token(self) -> float:
        return self.pcie_bytes / self.num_tokens / 1e6 if self.num_tokens else 0.0

    @property
    def cpu_mb_per_token(self) -> float:
        return self.cpu_bytes / self.num_tokens / 1e6 if self.num_tokens else 0.0

    @property
    def miss_ms_per_token(self) -> float | None:
        return None if self.miss_seconds is None or not self.num_tokens else 1e3 * self.miss_seconds / self.num_tokens


def preload_steps(capacity_slots: int, num_layers: int, num_experts: int) -> tuple[tuple[int, tuple[int, ...]], ...]:
    """The first `capacity_slots` (layer, expert) pairs in layer order, one step per layer: what a
    cache holds after the model is loaded, so that no policy starts with empty slots."""
    steps, left = [], min(capacity_slots, num_layers * num_experts)
    for layer in range(num_layers):
        if left <= 0:
            break
        steps.append((layer, tuple(range(min(left, num_experts)))))
        left -= num_experts
    return tuple(steps)


def replay(policy: CachePolicy, trace: RoutingTrace, *, cost: MissCost | None = None, warm: str = "batch",
           preload: bool = True) -> ReplayResult:
    """Load `policy`'s cache in layer order (`preload`; False: start empty, as the trace repository's
    replay does), pass the trace's prompt through it (`warm`: see `RoutingTrace.schedule`), then count
    the decode. With `cost`, also model the time each layer's misses take (`finish_seconds`)."""
    schedule = trace.schedule(warm)
    if preload:
        loaded = preload_steps(policy.capacity_slots, trace.num_layers, trace.num_experts)
        schedule = replace(schedule, warm=loaded + schedule.warm)
    policy.prepare(schedule)
    for layer, ids in schedule.warm:
        policy.warm(layer, ids)
    policy.reset_counters()
    sizes = np.asarray(trace.expert_bytes, dtype=np.int64).tolist()
    pcie_bytes = cpu_bytes = 0
    seconds = 0.0
    for layer, ids in schedule.decode:
        fills = policy.pcie_fills
        _, misses = policy.access(layer, ids)
        copied = policy.pcie_fills - fills
        pcie_bytes += copied * sizes[layer]
        cpu_bytes += (misses - copied) * sizes[layer]
        if cost is not None and misses:
            seconds += finish_seconds(copied, misses, sizes[layer], cost)
    return ReplayResult(policy.name, policy.capacity_slots, trace.num_decode_tokens, policy.reads, policy.hits,
                        policy.misses, policy.pcie_fills, policy.cpu_misses, pcie_bytes, cpu_bytes,
                        seconds if cost is not None else None)
