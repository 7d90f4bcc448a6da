"""Reference policies that policies are measured against: perfect LFU, and Belady's MIN, the offline
optimum (it reads the whole future from `prepare`, so no runtime can run it). Same interface as
runtime/policy/expert_cache.py; every miss they cache counts as a PCIe fill.
"""

from __future__ import annotations

import heapq
from bisect import bisect_right
from collections import defaultdict

from .expert_cache import CachePolicy, Key
from .trace import Schedule


class LFU(CachePolicy):
    """Perfect LFU: use counts kept for every pair ever seen; a miss is always cached, evicting the
    cached pair with the fewest uses (least recently used among ties). Never one the step needs."""

    def __init__(self, capacity_slots: int, *, name: str = "lfu") -> None:
        super().__init__(capacity_slots)
        self.name = name
        self._uses: defaultdict[Key, int] = defaultdict(int)
        self._last: dict[Key, int] = {}
        self._cached: set[Key] = set()
        self._heap: list[tuple[int, int, Key]] = []  # (uses, last use, key), stale entries skipped
        self._clock = 0

    def _step(self, layer: int, ids: list[int], warm: bool) -> tuple[int, int, int]:
        self._clock += 1
        needed = {(layer, e) for e in ids}
        hits = 0
        for key in needed:
            self._uses[key] += 1
            self._last[key] = self._clock
            hits += key in self._cached
            if key in self._cached:
                heapq.heappush(self._heap, (self._uses[key], self._clock, key))
        for e in ids:
            key = (layer, e)
            if key not in self._cached and self.capacity_slots > 0:
                if len(self._cached) >= self.capacity_slots and not self._evict(needed):
                    continue
                self._cached.add(key)
                heapq.heappush(self._heap, (self._uses[key], self._clock, key))
        return hits, len(ids) - hits, 0

    def _evict(self, needed: set[Key]) -> bool:
        kept = []
        try:
            while self._heap:
                entry = heapq.heappop(self._heap)
                uses, last, key = entry
                if key not in self._cached or (uses, last) != (self._uses[key], self._last[key]):
                    continue  # stale
                if key in needed:
                    kept.append(entry)
                    continue
                self._cached.discard(key)
                return True
            return False
        finally:
            for entry in kept:
                heapq.heappush(self._heap, entry)

    def resident(self) -> set[Key]:
        return set(self._cached)


class Belady(CachePolicy):
    """Belady's MIN, the offline optimum for uniform slots: on a miss with a full cache, evict the
    pair whose next use is farthest, or do not cache the missed one (it runs on the CPU) when its own
    next use is farther still. Reads the future from `prepare`; steps must then come in that order."""

    def __init__(self, capacity_slots: int, *, name: str = "belady") -> None:
        super().__init__(capacity_slots)
        self.name = name
        self._steps: list[tuple[int, tuple[int, ...]]] = []
        self._uses: dict[Key, list[int]] = {}
        self._next: dict[Key, int] = {}  # cached key -> its next use
        self._heap: list[tuple[int, Key]] = []  # (-next use, key), stale entries skipped
        self._pos = 0

    def prepare(self, schedule: Schedule) -> None:
        self._steps = [*schedule.warm, *schedule.decode]
        uses: defaultdict[Key, list[int]] = defaultdict(list)
        for t, (layer, ids) in enumerate(self._steps):
            for e in ids:
                uses[(layer, e)].append(t)
        self._uses, self._next, self._heap, self._pos = dict(uses), {}, [], 0

    def _next_use(self, key: Key, after: int) -> int:
        times = self._uses.get(key, [])
        i = bisect_right(times, after)
        return times[i] if i < len(times) else len(self._steps)  # never again

    def _step(self, layer: int, ids: list[int], warm: bool) -> tuple[int, int, int]:
        t = self._pos
        assert t < len(self._steps) and self._steps[t] == (layer, tuple(ids)), "Belady: steps out of schedule"
        self._pos += 1
        needed = {(layer, e) for e in ids}
        hits = pcie = 0
        for key in needed:
            if key in self._next:
                hits += 1
                self._cache(key, self._next_use(key, t))
        for e in ids:
            key = (layer, e)
            if key in self._next:
                continue
            nxt = self._next_use(key, t)
            if len(self._next) < self.capacity_slots or self._evict_farther_than(nxt, needed):
                self._cache(key, nxt)
                pcie += 1
        return hits, pcie, len(ids) - hits - pcie

    def _cache(self, key: Key, nxt: int) -> None:
        self._next[key] = nxt
        heapq.heappush(self._heap, (-nxt, key))

    def _evict_farther_than(self, nxt: int, needed: set[Key]) -> bool:
        kept = []
        try:
            while self._heap:
                neg, key = entry = heapq.heappop(self._heap)
                if self._next.get(key) != -neg:
                    continue  # stale
                kept.append(entry)
                if key in needed:
                    continue
                if -neg > nxt:
                    del self._next[key]
                    kept.pop()
                    return True
                return False  # the missed pair is needed last: do not cache it
            return False
        finally:
            for entry in kept:
                heapq.heappush(self._heap, entry)

    def resident(self) -> set[Key]:
        return set(self._next)
