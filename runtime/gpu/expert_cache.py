"""ExpertCache: fixed-size device slots holding expert records, shared by all MoE layers, one
global LRU over logical (layer, expert) keys.

The bookkeeping (the key table, each slot's owner and recency) lives in two places, one of them
authoritative at a time: numpy arrays on the host, where prefill, static residency, resize and
the tests decide fills (a lookup costs a microsecond there), and device tensors that the decode
path's route-plan kernel reads and updates with no host sync (`device_state`). Handing over is
lazy: the first device plan after a host change uploads, the first host access after a device
plan downloads (one sync, at a point that syncs anyway: prefill, resize, stats).

A slot holds one FTW record byte for byte (`slot_bytes` >= every bank's stride), so a fill is
one copy and `views` reads the parts in place.

A long prompt's bank buffers are slots too (`lend`): the last slots are emptied and kept from
every victim choice while the prompt streams its banks through them, and given back, empty, for
decode (`take_back`). So VRAM the prefill needs only while it runs does not come out of the
cache for the model's life: at llama.cpp's -ncmoe 12 VRAM on Qwen3-30B-A3B's shapes, two
1.2 GB buffers held beside the cache had left it 253 slots of its 509.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence

import numpy as np
import torch

from ftw import ExpertBank

from ..experts import HostExpertBank
from .kernels import PINNED_TIME
from .records import RecordViews
from .streams import DeviceStreams

log = logging.getLogger(__name__)

EMPTY = -1
Source = Callable[[int], torch.Tensor]  # key -> the expert's record (host bank row)


class ExpertCache:
    """`num_slots` slots of `slot_bytes` on `device`.

    - `slots` uint8 [S, slot_bytes] on the device: slot s holds one expert record;
    - `owner` int64 [S] (host, numpy): the key in slot s, or -1; key = layer * num_experts + expert;
    - `last_used` int64 [S] (host, numpy): the clock when slot s was last used (-1: never);
      the clock moves once per layer call (`tick` for a device plan, `advance` on the host), so
      the order is the global access order;
    - `pinned` bool [S] (host, numpy): slots never chosen as victims (static residency);
    - `device_state()`: (table int32 [L*E], owner int32 [S], last_used int64 [S]) on the device,
      and the clock's device copy, which decode plans move on themselves (`tick`).
    """

    def __init__(self, num_slots: int, slot_bytes: int, device: torch.device | str, *, num_layers: int,
                 num_experts: int, streams: DeviceStreams | None = None) -> None:
        if num_slots < 0 or slot_bytes <= 0:
            raise ValueError(f"an expert cache needs num_slots >= 0 and slot_bytes > 0, not {num_slots}, {slot_bytes}")
        self.device = torch.device(device)
        self.slot_bytes, self.num_layers, self.num_experts = slot_bytes, num_layers, num_experts
        self.streams = streams or DeviceStreams(self.device)
        self.clock = 0
        self.generation = -1  # bumped whenever the tensors are made anew (captured CUDA graphs hold their addresses)
        self._table = np.full(num_layers * num_experts, EMPTY, dtype=np.int32)
        self._loans = 0  # loans made so far (`lend`), the last one's id
        self._allocate(num_slots)

    def _allocate(self, num_slots: int) -> None:
        self.slots = torch.empty(num_slots, self.slot_bytes, dtype=torch.uint8, device=self.device)
        self._reset(num_slots, reallocated=True)

    def _reset(self, num_slots: int, *, reallocated: bool) -> None:
        """Every slot empty. `reallocated`: the slots are new tensors, so are the device state's,
        and `generation` moves on; else (clear) the device state keeps its tensors, refilled in
        place, and graphs captured over them stay valid."""
        if reallocated:
            self.generation += 1
            self._views: dict[int, RecordViews] = {}
            self._device: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
            self._device_clock: torch.Tensor | None = None  # int64 [1]: decode plans move it on (`tick`)
            self._device_clock_value: int | None = None  # the host clock it holds, as far as the host knows
        self._owner = np.full(num_slots, EMPTY, dtype=np.int64)
        self._last_used = np.full(num_slots, EMPTY, dtype=np.int64)
        self._pinned = np.zeros(num_slots, dtype=bool)
        self.lent_slots = 0  # the last slots, lent out as buffers (`lend`)
        self._loans += 1  # a reset of any kind ends the loan out (`holds_loan`)
        self._device_fresh = False  # the device tensors equal the host arrays
        self._host_fresh = True  # no device plan ran since the host arrays were last right

    # -- where the bookkeeping is authoritative -------------------------------------------------------

    def device_state(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(table, owner, last_used) on the device for a route plan to read and update; from this
        call the device copy is authoritative until the host next looks."""
        if self._device is None or not self._device_fresh:
            self._host()
            last_used = np.where(self._pinned, PINNED_TIME, self._last_used)
            state = (torch.from_numpy(self._table), torch.from_numpy(self._owner.astype(np.int32)),
                     torch.from_numpy(last_used))
            if self._device is None:
                self._device = tuple(t.to(self.device) for t in state)  # type: ignore[assignment]
            else:
                for dst, src in zip(self._device, state, strict=True):
                    dst.copy_(src)
            self._device_fresh = True
        if self._device_clock is None:
            self._device_clock = torch.tensor([self.clock], dtype=torch.int64, device=self.device)
        elif self._device_clock_value != self.clock:  # the host moved the clock (prefill, `advance`)
            self._device_clock.fill_(self.clock)
        self._device_clock_value = self.clock
        self._host_fresh = False
        return self._device  # type: ignore[return-value]

    def _host(self) -> None:
        """Make the host arrays authoritative again (one download after device plans)."""
        if self._host_fresh:
            return
        assert self._device is not None
        table, owner, last_used = (t.cpu().numpy() for t in self._device)
        self._table[:] = table
        self._owner[:] = owner
        self._last_used[:] = np.where(self._pinned, self._last_used, last_used)
        self._host_fresh = True

    def _changed_on_host(self) -> None:
        self._device_fresh = False

    @property
    def owner(self) -> np.ndarray:
        self._host()
        return self._owner

    @property
    def last_used(self) -> np.ndarray:
        self._host()
        return self._last_used

    @property
    def pinned(self) -> np.ndarray:
        """Read-write: a caller that pins slots must call `device_state` only afterwards."""
        self._host()
        self._changed_on_host()
        return self._pinned

    # -- lookup and recency -------------------------------------------------------------------------

    @property
    def num_slots(self) -> int:
        return self.slots.shape[0]

    @property
    def num_cached(self) -> int:
        return int(np.count_nonzero(self.owner >= 0))

    def key(self, layer: int, expert: int) -> int:
        return layer * self.num_experts + expert

    def lookup(self, keys: Sequence[int]) -> list[int]:
        """The slot of each key, -1 where it is not cached."""
        self._host()
        return self._table[list(keys)].tolist() if len(keys) else []

    def advance(self) -> int:
        """Move the clock (once per layer call); returns the new time."""
        self.clock += 1
        return self.clock

    def tick(self, calls: int = 1) -> torch.Tensor:
        """Move the clock for `calls` device plans that move the device's copy themselves
        (route_plan's `advance_clock`): returns that copy, an int64 [1] of fixed address, so a
        call captured in a CUDA graph needs nothing from the host per replay. Call
        `device_state` first."""
        clock = self.device_clock
        self.clock += calls
        self._device_clock_value = self.clock
        return clock

    @property
    def device_clock(self) -> torch.Tensor:
        """The device's copy of the clock, current as of `device_state` (a captured step's plans
        move it; `tick` then moves the host's)."""
        if self._device_clock is None or self._device_clock_value != self.clock:
            raise RuntimeError("ExpertCache: call device_state() first (the device clock is not current)")
        return self._device_clock

    def touch(self, slots: Sequence[int]) -> None:
        if len(slots):
            self.last_used[list(slots)] = self.clock
            self._changed_on_host()

    # -- eviction and fills ---------------------------------------------------------------------------

    def _evictable(self, protect: Sequence[int]) -> np.ndarray:
        self._host()
        ok = ~self._pinned
        if len(protect):
            held = self._table[list(protect)]
            ok[held[held >= 0]] = False
        return ok

    def num_evictable(self, protect: Sequence[int] = ()) -> int:
        """Slots a fill may use while the keys in `protect` (the current layer's) stay."""
        return int(np.count_nonzero(self._evictable(protect)))

    def victims(self, count: int, protect: Sequence[int] = ()) -> list[int]:
        """The `count` least recently used slots (empty ones first, then oldest; ties by slot
        index), never a pinned slot or one holding a key in `protect`."""
        if count <= 0:
            return []
        ok = self._evictable(protect)
        allowed = int(np.count_nonzero(ok))
        if allowed < count:
            raise ValueError(f"{count} victims asked, {allowed} slots may be evicted")
        n = self.num_slots
        score = self.last_used * n + np.arange(n)  # unique: a deterministic order
        score[~ok] = np.iinfo(np.int64).max
        chosen = np.argpartition(score, count - 1)[:count] if count < n else np.arange(n)
        return chosen[np.argsort(score[chosen])].tolist()

    def fill(self, keys: Sequence[int], victim_slots: Sequence[int], sources: Sequence[torch.Tensor]) -> list:
        """Copy `sources[i]` (a record: host bank row, or device bytes) into `victim_slots[i]` for
        `keys[i]` on the copy stream, evicting what the slot held. Returns one event per copy
        (None off CUDA): the compute stream must wait for it before reading the slot."""
        events = []
        with self.streams.copying():
            for key, slot, src in zip(keys, victim_slots, sources, strict=True):
                self._assign(key, slot)
                self.slots[slot, : src.numel()].copy_(src.reshape(-1), non_blocking=True)
                events.append(self.streams.record())
        return events

    def _assign(self, key: int, slot: int) -> None:
        self._host()
        self._changed_on_host()
        old = int(self._owner[slot])
        if old >= 0:
            self._table[old] = EMPTY
        if self._table[key] >= 0:
            raise ValueError(f"key {key} is cached already (slot {int(self._table[key])})")
        self._owner[slot], self._table[key], self._last_used[slot] = key, slot, self.clock

    def evict(self, keys: Sequence[int]) -> None:
        self._host()
        self._changed_on_host()
        for key in keys:
            slot = int(self._table[key])
            if slot >= 0:
                self._table[key] = EMPTY
                self._owner[slot], self._last_used[slot], self._pinned[slot] = EMPTY, EMPTY, False

    def clear(self) -> None:
        """Forget every entry (slots and the device state's tensors stay allocated: captured
        graphs stay valid)."""
        self.streams.synchronize()
        self._table.fill(EMPTY)
        self._reset(self.num_slots, reallocated=False)

    def release(self) -> None:
        """Give the device memory back now: no slots, every entry forgotten (`resize` makes room
        again). The slots are one of the largest allocations of a process; released here, they
        do not wait for the garbage collector to reach their owner (an executor holds reference
        cycles), which a model loaded next may need the room of."""
        self.streams.synchronize()
        self._table.fill(EMPTY)
        self._allocate(0)

    # -- slots lent as buffers -----------------------------------------------------------------------

    def lend(self, count: int) -> tuple[torch.Tensor, int] | None:
        """The last `count` slots as one flat uint8 buffer, and the loan's id (`holds_loan`): what
        they held is evicted, and they are kept from every victim choice, on the host and in
        device plans (a pinned slot's recency), until `take_back`. None where one of them is
        pinned (static residency), a loan is out already, or the cache has fewer slots."""
        if count <= 0 or count > self.num_slots or self.lent_slots:
            return None
        self._host()
        first = self.num_slots - count
        if self._pinned[first:].any():
            return None
        held = self._owner[first:]
        self._table[held[held >= 0]] = EMPTY
        self._owner[first:], self._last_used[first:], self._pinned[first:] = EMPTY, EMPTY, True
        self.lent_slots = count
        self._loans += 1
        self._changed_on_host()
        return self.slots[first:].view(-1), self._loans

    def holds_loan(self, loan: int) -> bool:
        """Whether the loan `loan` is still out (a clear, resize or release ends every loan)."""
        return self.lent_slots > 0 and loan == self._loans

    def take_back(self) -> None:
        """The lent slots are the cache's again, empty (the first victims). The caller has made
        sure nothing still reads them as a buffer: work queued after this point on the compute
        stream, or on the copy stream (which waits for the compute queued before its copies),
        runs after the reads queued before it."""
        if not self.lent_slots:
            return
        self._host()
        self._pinned[self.num_slots - self.lent_slots:] = False
        self.lent_slots = 0
        self._changed_on_host()

    # -- views ---------------------------------------------------------------------------------------

    def views(self, layout: ExpertBank) -> RecordViews:
        """Every slot seen as a record of `layout` (rows of the returned views are slot indices)."""
        if layout.expert_stride > self.slot_bytes:
            raise ValueError(f"layer {layout.layer}: records of {layout.expert_stride} bytes do not fit "
                             f"slots of {self.slot_bytes}")
        views = self._views.get(layout.layer)
        if views is None:
            views = self._views[layout.layer] = RecordViews(self.slots, layout)
        return views

    def expert_parts(self, slot: int, layout: ExpertBank) -> dict[str, torch.Tensor]:
        """One slot's parts as typed tensors (the same layout as HostExpertBank.raw_part)."""
        return {name: part[slot] for name, part in self.views(layout).parts.items()}

    # -- elastic size ---------------------------------------------------------------------------------

    def resize(self, num_slots: int, source: Source | None = None) -> None:
        """Rebuild with `num_slots` slots at a safe point (no copy or kernel in flight), keeping
        the entries that fit: pinned ones first, then the most recently used. Kept entries move to
        the lowest slots with their recency; the others are dropped.

        The kept bytes are copied device to device into the new slots; when the device cannot
        hold both sizes at once and `source` gives host records, the old slots are freed first and
        the kept entries refilled from the host instead."""
        self.streams.synchronize()
        self._host()
        occupied = np.flatnonzero(self.owner >= 0).tolist()
        occupied.sort(key=lambda s: (not self.pinned[s], -int(self.last_used[s]), s))
        keep = occupied[:num_slots]
        owner, last_used, pinned = self.owner[keep], self.last_used[keep], self.pinned[keep]
        old = self.slots
        try:
            new = torch.empty(num_slots, self.slot_bytes, dtype=torch.uint8, device=self.device)
            if keep:
                torch.index_select(old, 0, torch.tensor(keep, device=self.device), out=new[: len(keep)])
            refill = False
        except torch.OutOfMemoryError:
            if source is None:
                raise
            log.info("expert cache resize: no room for both sizes; refilling %d entries from host memory", len(keep))
            del old
            self._table.fill(EMPTY)
            self._allocate(0)  # the old slots' last references go (the views' too): their memory is free
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
            # no room for the new size alone either: the error goes up, the cache left empty (0 slots)
            new, refill = torch.empty(num_slots, self.slot_bytes, dtype=torch.uint8, device=self.device), True
        self.slots = new
        self._reset(num_slots, reallocated=True)
        self._table.fill(EMPTY)
        n = len(keep)
        self._owner[:n], self._last_used[:n], self._pinned[:n] = owner, last_used, pinned
        self._table[owner] = np.arange(n, dtype=np.int32)
        if refill and source is not None:
            with self.streams.copying():
                for slot, key in enumerate(owner.tolist()):
                    record = source(key)
                    self.slots[slot, : record.numel()].copy_(record.reshape(-1), non_blocking=True)
            self.streams.synchronize()


def whole_layers_that_fit(num_slots: int, banks: Mapping[int, HostExpertBank],
                          layers: Sequence[int] | None = None) -> list[int]:
    """The first of `layers` (default: every bank's), in order, whose experts fit `num_slots`
    together: llama.cpp's first-N-layers split."""
    chosen, room = [], num_slots
    for layer in sorted(banks if layers is None else layers):
        if banks[layer].num_experts > room:
            break
        chosen.append(layer)
        room -= banks[layer].num_experts
    return chosen


def place_whole_layers(cache: ExpertCache, banks: Mapping[int, HostExpertBank],
                       layers: Sequence[int] | None = None) -> tuple[int, ...]:
    """llama.cpp's static split: whole layers' experts made resident in pinned slots, filled once
    from the host banks, after emptying the cache. `layers`: those (an error if they do not fit);
    default: as many whole layers as fit, first ones first. Returns the layers placed."""
    cache.clear()
    if layers is None:
        chosen = whole_layers_that_fit(cache.num_slots, banks)
    else:
        chosen = sorted(layers)
        unknown = [layer for layer in chosen if layer not in banks]
        need = sum(banks[layer].num_experts for layer in chosen if layer in banks)
        if unknown or need > cache.num_slots:
            raise ValueError(f"static residency of layers {chosen}: unknown MoE layers {unknown}, or "
                             f"{need} experts for {cache.num_slots} slots")
    for layer in chosen:
        bank = banks[layer]
        keys = [cache.key(layer, e) for e in range(bank.num_experts)]
        victims = cache.victims(len(keys))
        cache.fill(keys, victims, [bank.record(e) for e in range(bank.num_experts)])
        cache.pinned[victims] = True
    cache.streams.synchronize()
    return tuple(chosen)
