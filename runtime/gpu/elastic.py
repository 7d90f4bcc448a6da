"""Elastic VRAM: the expert cache follows a budget that changes while the model is loaded.

Two reasons to change size, both applied by the executor at a safe point (the first MoE layer's
call of a step: nothing of the previous step is in flight once the resize has synchronized)
without reloading any weight (HybridExpertExecutor.resize keeps the most recent entries):

- `set_budget(bytes)`: the user asked (`/set vram GIB` in `ft run` on the GPU);
- another program took VRAM: every `check_every_s` the governor reads what this process could
  hold now, the device's free memory plus what its own allocator holds. When that no longer
  covers the budget (dense weights, KV, workspace and cache, as planned), the cache shrinks to
  what does, and torch's allocator cache is emptied so the other program can have the memory.
  When the memory comes back, the cache grows back toward the budget. The target is absolute, not
  a step: shrinking moves memory from held to free and leaves it unchanged, so it does not
  ratchet down. Small growth steps wait until they are worth a rebuild.

The floor is the fewest slots the executor's mode runs well on (build.floor_slots: one token's
experts, MoE layers x top-k, below which a global LRU thrashes; one layer's top-k for "auto",
which streams its misses through fewer): the governor never goes under it, and says so with the
numbers when the device would need it to.
This module is policy only (sizes in slots, from numbers it is given); `probe` is injectable.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import torch

from ..planner.footprint import size

log = logging.getLogger(__name__)

Probe = Callable[[], tuple[int, int]]  # () -> (free bytes on the device, bytes this process's allocator holds)
GiB = 1 << 30


def cuda_probe(device: torch.device) -> Probe:
    def probe() -> tuple[int, int]:
        free, _ = torch.cuda.mem_get_info(device)
        return int(free), int(torch.cuda.memory_reserved(device))

    return probe


class VramGovernor:
    """Decides the cache's slot count; `poll(current)` returns a new count or None."""

    def __init__(self, *, slot_bytes: int, budget_bytes: int, cache_slots: int, min_slots: int,
                 other_bytes: int | None = None, max_slots: int | None = None,
                 probe: Probe | None = None, margin_bytes: int = 0, check_every_s: float = 0.5,
                 clock: Callable[[], float] = time.monotonic, floor_name: str = "one token's experts") -> None:
        self.slot_bytes, self.min_slots = slot_bytes, min_slots
        self.floor_name = floor_name  # what min_slots is, in the messages
        self.max_slots = max_slots  # every expert of the model: more slots would stay empty
        # what the budget holds besides the cache (dense weights, KV, workspace): fixed while loaded.
        # Given by the plan; else what the budget leaves beside the cache (right when the cache fills it)
        self.other_bytes = max(0, budget_bytes - cache_slots * slot_bytes) if other_bytes is None else other_bytes
        self.budget_bytes = budget_bytes
        self.probe, self.check_every_s, self.clock = probe, check_every_s, clock
        self.margin_bytes = margin_bytes  # kept free beyond the budget (the plan's workspace already has a reserve)
        self._next_check = 0.0
        self._pending: int | None = None
        self._lock = threading.Lock()  # set_budget may come from another thread (the server's event loop)
        self.events: list[str] = []  # what changed and why, newest last (for `ft ps` / logs)

    @property
    def budget_slots(self) -> int:
        """The slots the budget holds (under the floor only where the load allowed that: the modes
        that do not fill the cache, or force)."""
        return max(0, self._capped((self.budget_bytes - self.other_bytes) // self.slot_bytes))

    def _capped(self, slots: int) -> int:
        return slots if self.max_slots is None else min(slots, self.max_slots)

    def set_budget(self, budget_bytes: int) -> int:
        """A new budget (bytes for everything, as at load); applied at the next safe point.
        Returns the slot count it asks for. Raises ValueError below one token's experts."""
        if not budget_bytes > 0:
            raise ValueError(f"a VRAM budget is a positive size, not {budget_bytes} bytes")
        slots = (budget_bytes - self.other_bytes) // self.slot_bytes
        if slots < self.min_slots:
            need = self.other_bytes + self.min_slots * self.slot_bytes
            raise ValueError(f"a VRAM budget of {size(budget_bytes)} leaves {max(slots, 0)} expert slots, fewer "
                             f"than {self.floor_name} ({self.min_slots} slots of {size(self.slot_bytes)}); "
                             f"give at least {size(need)}")
        slots = self._capped(slots)
        with self._lock:
            self.budget_bytes = budget_bytes
            self._pending = slots
        return slots

    def poll(self, current: int) -> int | None:
        """At a safe point: the slot count to resize to now, or None to stay."""
        with self._lock:
            target, self._pending = self._pending, None
        if self.probe is not None and self.clock() >= self._next_check:
            self._next_check = self.clock() + self.check_every_s
            target = self._fit_free_memory(self.budget_slots if target is None else target, current)
        if target is None or target == current:
            return None
        self.events.append(f"expert cache {current} -> {target} slots ({size(target * self.slot_bytes)})")
        log.info("%s", self.events[-1])
        return target

    def _fit_free_memory(self, wanted: int, current: int) -> int:
        free, held = self.probe()  # type: ignore[misc]
        available = free + held  # what this process could hold now: what it holds, and what nobody does
        fits = (available - self.margin_bytes - self.other_bytes) // self.slot_bytes
        target = min(wanted, fits)
        if target < self.min_slots:
            keep = min(current, self.min_slots)  # not below the floor, and never grown here
            log.warning("%s of VRAM is left to this process (%s free), too little for its dense weights, KV and "
                        "%s; the expert cache stays at %d slots: other programs on this GPU may run out of memory",
                        size(available), size(free), self.floor_name, keep)
            return keep
        if current < target < wanted and target - current < max(1, current // 32):
            return current  # a small step up: not worth a rebuild yet
        return target
