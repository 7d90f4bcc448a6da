"""Prefill: a long prompt routes to nearly every expert of a layer, so each MoE layer's whole bank
is streamed to the device and its experts run there.

Double-buffered (the default): two bank-sized device buffers; while layer l's experts (and layer
l+1's attention) compute from one, the copy stream fills the other with the next MoE layer's
bank. Single-buffered: one buffer, each bank copied when its layer is reached (no overlap; the
benchmark's baseline). Experts the cache holds are not streamed over PCIe: the copy stream copies
them from their slots into their rows of the buffer, so every expert is read in place from one
bank (computed from their slots, they were gathered into temporary copies, up to 32 records a
batch: 288 MiB of Qwen3-30B-A3B's).
Measured on the H200 host (1.2 GB bf16 banks, 2048 tokens, no attention between the layers):
both copy-bound at ~55 GB/s, 22-23 ms a layer; double buffering gains what runs between two
banks (attention, the experts' ~3 ms), so the gain shows in whole-model prefill.

The cache after a prefill (documented choice, per placement):
- "lru" (modes auto, offload): as if the last prompt token had been decoded: its experts of
  every layer are touched or inserted (copied device to device from the buffer, no PCIe), the
  most recent entries; nothing else changes.
- "hot" (mode prefill_placement): each layer gets an equal share of the slots, filled with the
  experts the prompt routed to most (ties: lower id), then, where the prompt routed to fewer,
  with the layer's others (lower id first); the layer's other entries are dropped.
- "none" (modes static, cpu): the cache is left as it was.

A long prompt on the GPU path comes a chunk of tokens at a time (DecoderModel's
prefill_chunk_tokens; runtime/models/base.py `prompt_chunk` says which): each layer's chunks one
after the other, so the layer's bank is streamed at its first chunk and read by every chunk
after it (the next layer's prefetch is not disturbed), the clock moves once a layer, and the
placement above is made once, at the last chunk, from the whole prompt's routing: the cache
ends as it would after one call of all the tokens. CachePrefill fills a layer's experts at its
first chunk that routes to them; later chunks find them cached (the bank is read once) unless the
cache holds fewer than the layer's experts.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from ..experts import HostExpertBank
from ..models.base import prompt_chunk
from .expert_cache import ExpertCache
from .records import PairPlan, RecordViews, experts_from_records
from .streams import DeviceStreams

PLACEMENTS = ("lru", "hot", "none")


@dataclass
class LoadedBank:
    layer: int
    buffer: int
    rows: torch.Tensor  # uint8 [E, stride] on the device: the layer's records, streamed or copied from slots
    event: object | None
    skipped: dict[int, int] = field(default_factory=dict)  # expert -> the slot its row was copied from (no PCIe)


class BankStreamer:
    """Copies whole banks into `num_buffers` (1 or 2) bank-sized device buffers on the copy stream.

    The buffers are the cache's last slots, lent for the prompt (ExpertCache.lend), where the
    cache keeps at least `lend_above` slots beside them; else (None, or a cache too small or
    pinned there) they are allocated, and held until `release`. A loan goes back at
    `return_loan`, before decode: the slots return empty."""

    def __init__(self, banks: dict[int, HostExpertBank], cache: ExpertCache, *, num_buffers: int = 2,
                 pcie_repeat: int = 1, lend_above: int | None = None) -> None:
        self.pcie_repeat = pcie_repeat  # copies per transfer: >1 emulates a slower link (benchmarks)
        if num_buffers not in (1, 2):
            raise ValueError(f"num_buffers is 1 (single-buffered) or 2 (double-buffered), not {num_buffers}")
        self.banks, self.cache, self.streams = banks, cache, cache.streams
        self.num_buffers = num_buffers
        layers = sorted(banks)
        self.next_layer = dict(zip(layers, layers[1:], strict=False))
        self.buffer_bytes = max((b.layout.nbytes for b in banks.values()), default=0)
        self.buffers: list[torch.Tensor] = []
        self.lend_above = lend_above
        self._loan: int | None = None  # the cache's loan the buffers are (None: their own memory, or none)
        self._pending: dict[int, LoadedBank] = {}
        self._current: LoadedBank | None = None  # the bank taken last (a prompt's later chunks read it)
        self._turn = 0
        self.bytes_streamed = 0
        self.experts_skipped = 0

    def release(self) -> None:
        """Free the buffers (VRAM back to the cache or other programs); they come back on use."""
        self.streams.synchronize()
        self._drop_buffers()

    @property
    def lent(self) -> bool:
        """Whether the buffers are slots the cache lent (and still lends)."""
        return self._loan is not None and self.cache.holds_loan(self._loan)

    def return_loan(self) -> None:
        """Give lent buffers back to the cache (no wait: see ExpertCache.take_back; the caller
        has made the compute stream wait for this streamer's copies). Own buffers are kept."""
        if self._loan is not None:
            self._drop_buffers()

    def _drop_buffers(self) -> None:
        if self.lent:
            self.cache.take_back()
        self.buffers, self._pending, self._current, self._loan = [], {}, None, None

    def take(self, layer: int, keep: bool = False) -> LoadedBank:
        """`layer`'s bank on the device (prefetched, or copied now); the compute stream waits for it.
        `keep`: the call continues the layer taken last (a later chunk of a prompt), whose bank is
        read where it is and whose prefetch of the next layer goes on."""
        current = self._current
        if keep and current is not None and current.layer == layer:
            loaded = current
        else:
            loaded = self._pending.pop(layer, None)
            self._pending.clear()  # a prefetch for another layer is stale: its buffer gets reused
            if loaded is None:
                loaded = self._load(layer, self._free_buffer(busy=None))
            self._current = loaded
        self._refresh(loaded)
        self.streams.wait(loaded.event)
        return loaded

    def prefetch_after(self, loaded: LoadedBank) -> None:
        """Double-buffered: start copying the next MoE layer's bank into the other buffer. Called
        after the layer's small uploads are queued: host-to-device copies share the DMA engine,
        and an upload queued behind a bank would hold the layer's compute back by a whole bank."""
        following = self.next_layer.get(loaded.layer)
        if self.num_buffers == 2 and following is not None and following not in self._pending:
            self._pending[following] = self._load(following, self._free_buffer(busy=loaded.buffer))

    def pending_skips(self) -> list[int]:
        """Keys a prefetched bank reads from the cache instead of its buffer (not to be evicted)."""
        return [self.cache.key(p.layer, e) for p in self._pending.values() for e in p.skipped]

    def _free_buffer(self, busy: int | None) -> int:
        if self._loan is not None and not self.lent:  # the cache was cleared or rebuilt under the loan
            self._drop_buffers()
        if not self.buffers:
            self.buffers = self._borrow() or [torch.empty(self.buffer_bytes, dtype=torch.uint8, device=self.cache.device)
                                              for _ in range(self.num_buffers)]
        index = self._turn if busy is None or self._turn != busy else (self._turn + 1) % self.num_buffers
        self._turn = (index + 1) % self.num_buffers
        return index

    def _borrow(self) -> list[torch.Tensor]:
        """The buffers as slots the cache lends ([] where it does not)."""
        per_buffer = -(-self.buffer_bytes // self.cache.slot_bytes)
        count = self.num_buffers * per_buffer
        if self.lend_above is None or self.cache.num_slots - count < self.lend_above:
            return []
        loan = self.cache.lend(count)
        if loan is None:
            return []
        flat, self._loan = loan
        size = per_buffer * self.cache.slot_bytes
        return [flat[i * size: (i + 1) * size] for i in range(self.num_buffers)]

    def _load(self, layer: int, buffer: int) -> LoadedBank:
        bank = self.banks[layer]
        num, stride = bank.num_experts, bank.layout.expert_stride
        rows = self.buffers[buffer][: num * stride].view(num, stride)
        slots = self.cache.lookup([self.cache.key(layer, e) for e in range(num)])
        skipped = {e: s for e, s in enumerate(slots) if s >= 0}
        with self.streams.copying():  # ordered after the compute that last read this buffer
            start = 0
            while start < num:  # one copy per run of experts the cache does not hold
                if start in skipped:
                    start += 1
                    continue
                end = start
                while end < num and end not in skipped:
                    end += 1
                for _ in range(self.pcie_repeat):
                    rows[start:end].copy_(bank.data[start:end], non_blocking=True)
                self.bytes_streamed += (end - start) * stride
                start = end
            for e, s in skipped.items():  # device to device: what the slot holds now, whatever evicts it later
                rows[e].copy_(self.cache.slots[s, :stride], non_blocking=True)
            event = self.streams.record()
        self.experts_skipped += len(skipped)
        return LoadedBank(layer, buffer, rows, event, skipped)

    def _refresh(self, loaded: LoadedBank) -> None:
        """Experts skipped at prefetch time but evicted since are no longer the slot's to touch
        (their rows were copied at prefetch time, before the eviction in stream order)."""
        for e in [e for e, s in loaded.skipped.items() if int(self.cache.owner[s]) != self.cache.key(loaded.layer, e)]:
            del loaded.skipped[e]


class StreamingPrefill:
    """One MoE layer of a prefill on the device from a streamed bank; keeps the cache coherent."""

    usable = True  # (CachePrefill's needs a slot)

    def __init__(self, banks: dict[int, HostExpertBank], cache: ExpertCache, compute_dtype: torch.dtype, *,
                 num_buffers: int = 2, placement: str = "lru", pcie_repeat: int = 1,
                 lend_above: int | None = None) -> None:
        if placement not in PLACEMENTS:
            raise ValueError(f"placement is one of {', '.join(PLACEMENTS)}, not {placement!r}")
        self.banks, self.cache, self.dtype, self.placement = banks, cache, compute_dtype, placement
        self.streamer = BankStreamer(banks, cache, num_buffers=num_buffers, pcie_repeat=pcie_repeat,
                                     lend_above=lend_above)
        self.layer_index = {layer: i for i, layer in enumerate(sorted(banks))}
        self._fills_unsettled = False  # cache fills queued on the copy stream that no compute waited for
        self._routed: list[torch.Tensor] = []  # the layer's routing so far, chunk by chunk (host)

    def settle(self) -> None:
        """Before the first decode call after a prefill: the compute stream waits for the cache
        fills the prefill queued on the copy stream. A prefill layer does not wait for its own
        fills (the copy stream may be streaming the next bank ahead of them, and the next layer's
        bank event covers them); the last layers' fills are covered by nothing else, and decode
        reads those slots, or refills them, on the compute stream. Buffers the cache lent go
        back to it here: decode fills them from now on."""
        if self._fills_unsettled or self.streamer.lent:
            self.streams.wait_for_copies()
            self._fills_unsettled = False
            self.streamer.return_loan()  # the buffers' slots, for decode to fill

    @property
    def streams(self) -> DeviceStreams:
        return self.cache.streams

    @property
    def bytes_streamed(self) -> int:
        return self.streamer.bytes_streamed

    @property
    def experts_skipped(self) -> int:
        return self.streamer.experts_skipped

    def release(self) -> None:
        """Free the buffers (before the cache moves, or at the end)."""
        self.streamer.release()

    def __call__(self, layer: int, x: torch.Tensor, expert_ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        bank = self.banks[layer]
        (ids,) = self.streams.download(expert_ids)  # the grouping by expert is planned on the host
        ids = ids.to(torch.int64)
        chunk = prompt_chunk()
        continuing = chunk is not None and not chunk.first
        if not continuing:
            self.cache.advance()
            self._routed = []
        self._routed.append(ids)
        loaded = self.streamer.take(layer, keep=continuing)
        out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
        plan = PairPlan.of_every_expert(expert_ids, ids)  # (on the device: an upload would wait behind a bank)
        self.streamer.prefetch_after(loaded)
        if plan is not None:
            experts_from_records(x, weights, plan, RecordViews(loaded.rows, bank.layout), self.dtype, out)
        if chunk is not None and not chunk.last:
            return out.to(x.dtype)  # the layer's placement at its last chunk, from all of its routing
        routed = self._routed[0] if len(self._routed) == 1 else torch.cat(self._routed)
        self._routed = []
        if loaded.skipped:
            self.cache.touch(list(loaded.skipped.values()))
        if self.placement == "lru":
            self._insert(loaded, self._recent_experts(routed))
        elif self.placement == "hot":
            self._place_hottest(loaded, routed)
        return out.to(x.dtype)

    def _recent_experts(self, ids: torch.Tensor) -> list[int]:
        """What the global LRU keeps of this layer's prompt: its experts, the last tokens' first,
        as many as the layer's share of the cache (every one of the last token's at least). All of
        them on a short prompt, so decode starts from a warm cache (kept to the last token's, the
        Qwen3-30B trace missed 7.6% of decode reads at 32 GiB instead of 3.4%: bench_traces.py);
        the share on a long one, which routes to nearly every expert of every layer and would
        otherwise leave only its last layers cached."""
        share = max(ids.shape[1], (self.cache.num_slots - self.cache.lent_slots) // len(self.layer_index))
        routed = ids.flip(0).reshape(-1).numpy()  # the last token's pairs first
        seen = 4 * share  # a long prompt's last few tokens hold the share: not a pass over all of it
        while True:
            experts, first = np.unique(routed[:seen], return_index=True)
            if len(experts) >= share or seen >= len(routed):
                return experts[np.argsort(first)][:share].tolist()  # in order of first sight from the end
            seen *= 4

    def _insert(self, loaded: LoadedBank, experts: list[int]) -> None:
        """Touch or insert `experts` of the layer (from the buffer: device to device)."""
        keys = [self.cache.key(loaded.layer, e) for e in experts]
        slots = self.cache.lookup(keys)
        self.cache.touch([s for s in slots if s >= 0])
        missing = [(k, e) for k, e, s in zip(keys, experts, slots, strict=True) if s < 0]
        protect = keys + self.streamer.pending_skips()
        missing = missing[: self.cache.num_evictable(protect)]
        if missing:
            victims = self.cache.victims(len(missing), protect)
            self.cache.fill([k for k, _ in missing], victims, [loaded.rows[e] for _, e in missing])
            self._fills_unsettled = True  # waited for by a later bank's event, or by `settle`

    def _place_hottest(self, loaded: LoadedBank, expert_ids: torch.Tensor) -> None:
        num_layers, num_slots = len(self.layer_index), self.cache.num_slots
        index = self.layer_index[loaded.layer]
        quota = num_slots // num_layers + (1 if index < num_slots % num_layers else 0)
        counts = torch.bincount(expert_ids.reshape(-1), minlength=self.banks[loaded.layer].num_experts).tolist()
        # the prompt's experts by count, then, so that no slot of the quota stays empty, the others
        # lowest id first (the whole bank was streamed: they cost no more PCIe; the trace
        # simulator's placement fills every slot too)
        hot = sorted(range(len(counts)), key=lambda e: (-counts[e], e))[:quota]
        layer_keys = range(self.cache.key(loaded.layer, 0), self.cache.key(loaded.layer + 1, 0))
        held = [k for k, s in zip(layer_keys, self.cache.lookup(list(layer_keys)), strict=True) if s >= 0]
        wanted = {self.cache.key(loaded.layer, e) for e in hot}
        self.cache.evict([k for k in held if k not in wanted and k not in self.streamer.pending_skips()])
        self._insert(loaded, sorted(hot))


class CachePrefill:
    """A prefill with no bank buffer (the fit plan left no VRAM for one beside one token's experts
    in the cache): each MoE layer's experts the prompt routes to are filled into the cache itself,
    into LRU victims, from the pinned host bank, then computed from their slots, grouped by expert
    as a streamed bank's are. Nothing overlaps (as single-buffered), nothing is read per pair (the
    decode path's slot kernel reads an expert once per routed pair: a long prompt's layer would
    read each expert thousands of times), and the prompt's experts stay cached, most recent last.
    A layer routing to more experts than the cache can take beside its own runs in rounds."""

    def __init__(self, banks: dict[int, HostExpertBank], cache: ExpertCache, compute_dtype: torch.dtype, *,
                 pcie_repeat: int = 1) -> None:
        self.banks, self.cache, self.dtype, self.pcie_repeat = banks, cache, compute_dtype, pcie_repeat
        self.bytes_streamed = 0
        self.experts_skipped = 0

    @property
    def streams(self) -> DeviceStreams:
        return self.cache.streams

    @property
    def usable(self) -> bool:
        """A cache with no slot holds nothing to compute from (its calls are the CPU's)."""
        return self.cache.num_slots > 0

    def release(self) -> None:  # no buffer to give back
        pass

    def settle(self) -> None:  # every fill was waited for by the compute that read it
        pass

    def __call__(self, layer: int, x: torch.Tensor, expert_ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        bank, cache = self.banks[layer], self.cache
        (ids,) = self.streams.download(expert_ids)
        ids = ids.to(torch.int64)
        chunk = prompt_chunk()
        if chunk is None or chunk.first:  # the clock moves once a layer, however many chunks its prompt comes in
            cache.advance()
        experts = np.unique(ids.numpy()).tolist()  # (numpy: PairPlan.build says why)
        slots = cache.lookup([cache.key(layer, e) for e in experts])
        ready = {e: s for e, s in zip(experts, slots, strict=True) if s >= 0}  # computed from their slots as they are
        cache.touch(list(ready.values()))
        self.experts_skipped += len(ready)
        pending = [e for e in experts if e not in ready]
        out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
        views = cache.views(bank.layout)
        while ready or pending:
            if pending:
                protect = [cache.key(layer, e) for e in ready]
                batch = pending[: cache.num_evictable(protect)]
                if not batch and not ready:
                    raise RuntimeError(f"layer {layer}: the expert cache has no slot to fill (all pinned)")
                pending = pending[len(batch):]
                ready.update(zip(batch, self._fill(layer, batch, protect), strict=True))
            # planned on the host in numpy (inside DeviceModel torch's default device is the GPU,
            # where the plan's nonzero, unique and lists would each wait for the device)
            row_of = np.full(bank.num_experts, -1, dtype=np.int64)
            row_of[list(ready)] = list(ready.values())
            plan = PairPlan.build(ids, row_of, self.streams.upload)
            if plan is not None:
                experts_from_records(x, weights, plan, views, self.dtype, out)
            ready = {}  # the next round may evict them: copies wait for the compute queued before them
        return out.to(x.dtype)

    def _fill(self, layer: int, experts: list[int], protect: list[int]) -> list[int]:
        """`experts` of `layer` copied into LRU victims (never a key in `protect`); the compute
        stream waits for the copies. Returns their slots."""
        if not experts:
            return []
        cache, bank = self.cache, self.banks[layer]
        victims = cache.victims(len(experts), protect)
        records = [bank.record(e) for e in experts]
        cache.fill([cache.key(layer, e) for e in experts], victims, records)
        with self.streams.copying():  # an emulated slower link (benchmarks): the same bytes again
            for _ in range(self.pcie_repeat - 1):
                for slot, record in zip(victims, records, strict=True):
                    cache.slots[slot, : record.numel()].copy_(record.reshape(-1), non_blocking=True)
        self.streams.wait_for_copies()
        self.bytes_streamed += len(experts) * bank.layout.expert_stride
        return victims
