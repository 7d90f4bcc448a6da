"""HybridExpertExecutor: the routed experts of one MoE layer, from the device cache, over PCIe, or on
the CPU, in the split the mode (and for "auto", the measured bandwidths) decide.

One decode call, queued with no host sync: the route-plan kernel (kernels/route_plan.py) dedups
the routed experts, classifies hits and misses against the cache's device table, lets the first
n misses take LRU victim slots (never a slot the layer needs) and marks the rest for the CPU;
every device pair is computed from its slot (slot_compute.py), and in the same launch the n
misses are read from the pinned host banks over PCIe and left in their slots (one token; with
more, the fill kernel copies them first); the CPU share runs on a worker
thread straight from the host bank, and the device stream waits for its result before adding
it (cpu_share.py). The launching thread goes on to the next layer at once. A call with many
tokens (prefill) streams the whole bank instead (prefill.py), once for all the chunks a long
prompt's layer comes in (runtime/models/base.py `prompt_chunk`). A caller's whole decode step can
run as one CUDA graph: `begin_step`, `capturing_step` and `end_step` (executor_steps.py) are the
executor's side of step_graphs.py.

Modes (how many misses cross PCIe): "offload" all; "cpu" none; "static" none, with whole layers
resident from the start (llama.cpp's static split); "prefill_placement" none, the cache placed
by each prefill's routing counts; "auto" the count the one cost model (policy/miss_split.py,
through split.py) gives for the measured BandwidthProfile, each CPU-served miss charged the later
miss it causes at the cache's recent hit rate, as the trace simulator's `automatic` policy does.
"auto" hands the plan a table of that count for every possible number of misses, so the choice
is made on the device.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import replace

import torch

from ..experts import CPUExpertExecutor, ExpertExecutor, HostExpertBank
from ..models.base import prompt_chunk
from ..policy.miss_split import DEFAULT_FILL_PRICING
from .auto_guard import PCIE_ONLY, AutoGuard
from .bandwidth_profile import BandwidthProfile
from .cpu_share import CPUShare, Job
from .decode_graphs import DecodeGraphs
from .elastic import VramGovernor
from .executor_stats import DeviceCounts, ExpertStats
from .executor_steps import WholeStepCalls
from .expert_cache import ExpertCache, place_whole_layers, whole_layers_that_fit
from .kernels import MAX_KERNEL_PAIRS, RoutePlan, route_plan_ref
from .kernels.expert_fill_ref import expert_fill_ref
from .prefill import CachePrefill, StreamingPrefill
from .records import check_device_layout
from .slot_compute import add_slot_experts, fills_in_launch
from .split import Split, SplitTables
from .step_graphs import StepCapture, StepGraphs

log = logging.getLogger(__name__)

MODES = ("auto", "offload", "cpu", "static", "prefill_placement")
PLACEMENT = {"auto": "lru", "offload": "lru", "static": "none", "prefill_placement": "hot", "cpu": "none"}


def _device_kernels(device: torch.device) -> tuple[Callable, Callable, Callable] | None:
    """(route_plan, expert_fill, cast_out), the Triton kernels, on CUDA with triton installed; else None
    (the torch twins plan and fill, with a host sync per layer on CUDA). Imported here, not at
    module import: tests choose triton's interpreter before the kernel modules load."""
    if device.type != "cuda":
        return None
    try:
        from .kernels.cast_out import cast_out
        from .kernels.expert_fill import expert_fill
        from .kernels.route_plan import route_plan
    except ImportError:  # pragma: no cover - depends on the install
        log.warning("triton is not installed: expert routing is planned on the host (slower)")
        return None
    return route_plan, expert_fill, cast_out


def _torch_cast(src: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return src.to(dtype)


class HybridExpertExecutor(WholeStepCalls):
    """An ExpertExecutor over host banks (pinned on CUDA) and a device ExpertCache.

    `cpu_executor` runs the CPU share (default: CPUExpertExecutor over the same banks);
    `compute_dtype` is the device compute dtype; `profile` feeds "auto" (or pass `split`, any
    (misses, expert_bytes) -> count function, e.g. a cache-policy chooser). The recent hit rate
    that prices a CPU-served miss is the simulator's: hits over distinct experts of decode layer
    calls, both decayed by HIT_RATE_DECAY per call (an exponential moving average, 0 before any). "static" keeps
    `static_resident_layers` (default: as many whole layers as fit, first ones first) resident.
    Calls with at least `prefill_min_tokens` tokens stream whole banks through `prefill_buffers`
    (2: double-buffered, 1: single, 0: never) bank-sized device buffers: the cache's last slots,
    lent for the prompt, where it keeps `prefill_lend_above` slots beside them (None: never
    lent, the buffers held for the executor's life). "auto" checks its split
    against plain offload on whole decode steps and keeps the faster (auto_guard.py), unless
    `auto_guard` is False. `cuda_graphs` (on by default; CUDA with triton only) replays decode calls
    as CUDA graphs (decode_graphs.py), those with a CPU share where the driver's stream flags can
    be captured (host_signal.py); with `step_graphs` too, a caller's whole decode step runs as
    one graph (`steps`, step_graphs.py). `pcie_repeat` > 1 emulates a slower link for
    benchmarks: every copy over PCIe (fills, prefill streams) is made that many times.
    """

    def __init__(self, banks: dict[int, HostExpertBank], *, device: torch.device | str, cache: ExpertCache,
                 mode: str = "auto", cpu_executor: ExpertExecutor | None = None,
                 compute_dtype: torch.dtype = torch.bfloat16, profile: BandwidthProfile | None = None,
                 static_resident_layers: Sequence[int] | None = None, split: Split | None = None,
                 prefill_min_tokens: int = 32, prefill_buffers: int = 2, auto_guard: bool = True,
                 cuda_graphs: bool = True, step_graphs: bool = True, pcie_repeat: int = 1,
                 prefill_lend_above: int | None = None, fill_pricing: str = DEFAULT_FILL_PRICING) -> None:
        if mode not in MODES:
            raise ValueError(f"mode is one of {', '.join(MODES)}, not {mode!r}")
        if pcie_repeat < 1:
            raise ValueError(f"pcie_repeat is a whole number of copies, at least 1, not {pcie_repeat}")
        self.pcie_repeat = pcie_repeat
        if mode == "auto" and split is None and profile is None:
            raise ValueError("mode 'auto' needs a BandwidthProfile (runtime.gpu.measure_bandwidth.load_or_measure) or a split")
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
        self.splits = SplitTables(mode, split, profile, self.device, fill_pricing)
        self.counts = DeviceCounts(self.device)  # the route plan's running sums (read by stats())
        self.guard = AutoGuard(min(banks), self.counts.cpu_experts) if mode == "auto" and auto_guard and banks else None
        self.first_layer = min(banks) if banks else 0
        self.elastic: VramGovernor | None = None  # set by load_gpu: the cache follows the VRAM budget
        self.prefill_min_tokens = prefill_min_tokens
        self.prefill = self._prefill_path(prefill_buffers, prefill_lend_above)
        kernels = _device_kernels(self.device)
        self._route_plan, self._expert_fill, self._cast_out = kernels or (route_plan_ref, None, _torch_cast)
        # zero-copy fills read the bank over PCIe from the device: only from page-locked memory
        self._zero_copy = {layer: kernels is not None and bank.data.is_pinned() for layer, bank in banks.items()}
        self.cpu_share = CPUShare(self.cpu_executor, self.device)
        # decode calls replayed as CUDA graphs (decode_graphs.py)
        self.graphs = DecodeGraphs(self.device) if cuda_graphs and kernels is not None else None
        self._graph_work_at_step = 0  # graphs' one-time work when the current step began (the guard's timing)
        self.steps = StepGraphs(self)  # whole decode steps as one graph each (step_graphs.py)
        self.step_graphs = step_graphs
        self._step_begun = False  # begin_step made the step's first-call host part
        self._step_capture: StepCapture | None = None  # set while a whole step is being captured
        self._step_state: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
        self._step_tables: set[tuple[int, int]] = set()  # (pairs, expert bytes) of split tables captured steps read
        self._step_cpu = False  # the step begun carries CPU shares (begin_step)
        self._stats = ExpertStats()
        self._static_request = static_resident_layers
        self.resident_layers: tuple[int, ...] = ()
        if mode == "static":
            self._make_resident()

    def _prefill_path(self, buffers: int, lend_above: int | None) -> StreamingPrefill | CachePrefill | None:
        """How calls of many tokens run: banks streamed through `buffers` device buffers (slots
        the cache lends for the prompt, where it keeps `lend_above` beside them); with none, the
        LRU modes' experts streamed through the cache itself; else (the CPU modes, and the
        placements that must not disturb the cache) as decode calls."""
        placement = PLACEMENT[self.mode]
        if self.mode == "cpu":
            return None
        if buffers:
            return StreamingPrefill(self.banks, self.cache, self.compute_dtype, num_buffers=buffers,
                                    placement=placement, pcie_repeat=self.pcie_repeat, lend_above=lend_above)
        if placement == "lru":
            return CachePrefill(self.banks, self.cache, self.compute_dtype, pcie_repeat=self.pcie_repeat)
        return None

    # -- the ExpertExecutor call ---------------------------------------------------------------------

    def __call__(self, layer: int, x: torch.Tensor, expert_ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        # Host tensors here name device="cpu": inside DeviceModel, torch's default device is the GPU.
        if self._step_capture is not None:
            return self._decode_captured(layer, x, expert_ids, weights)
        chunk = prompt_chunk()  # a chunk of a long prompt: many tokens, however few are left for the last one
        streamed_prefill = (self.prefill is not None and (x.shape[0] >= self.prefill_min_tokens or chunk is not None)
                            and self.prefill.usable)
        # a step begins (a later chunk continues the one its first began): its host part, unless begin_step made it
        if layer == self.first_layer and (chunk is None or chunk.first):
            if self._step_begun:
                self._step_begun = False
            else:
                self._start_step(decode=not streamed_prefill)
        start = time.perf_counter()
        if streamed_prefill:
            streamed, skipped = self.prefill.bytes_streamed, self.prefill.experts_skipped
            out = self.prefill(layer, x, expert_ids, weights)
            s = self._stats
            s.prefill_calls, s.prefill_tokens = s.prefill_calls + 1, s.prefill_tokens + x.shape[0]
            s.prefill_bytes += self.prefill.bytes_streamed - streamed
            s.prefill_experts_skipped += self.prefill.experts_skipped - skipped
            s.prefill_ms += (time.perf_counter() - start) * 1e3
            if self.guard is not None:
                self.guard.interrupt()
            return out
        out = self._decode(layer, x, expert_ids, weights)
        self._stats.decode_ms += (time.perf_counter() - start) * 1e3
        return out

    def _decode(self, layer: int, x: torch.Tensor, expert_ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """Plan, fill, compute and combine on the device; the CPU share beside it (no host sync)."""
        bank, cache = self.banks[layer], self.cache
        stride = bank.layout.expert_stride
        num_pairs = expert_ids.numel()
        n_pcie, uses_cpu = self._miss_split(num_pairs, stride)
        # uploaded here, outside any graph capture, when the host changed the bookkeeping
        state = cache.device_state()
        clock = cache.tick()  # the device copy of the clock, which the plan moves on
        # with every miss sent to PCIe, one still lands on the CPU when no slot may take it: more
        # distinct experts than slots
        may_use_cpu = uses_cpu or num_pairs > cache.num_slots
        out, counts = None, None
        if self.graphs is not None and (not may_use_cpu or self.cpu_share.capturable) \
                and num_pairs <= MAX_KERNEL_PAIRS and self._zero_copy[layer]:
            out = self._replay(layer, state, x, expert_ids, weights, clock, n_pcie, may_use_cpu)
        if out is None:
            out, plan, _ = self._plan_fill_compute(layer, state, x, expert_ids, weights, clock, n_pcie, may_use_cpu)
            counts = plan.counts
        self._stats.calls += 1
        self._stats.tokens += x.shape[0]
        if self.mode == "auto":
            self.splits.hit_rate.observe(counts, self.counts.all())
        return out

    def _start_step(self, decode: bool, queued: bool = False) -> None:
        """The host part of a step's first layer call: a safe point for an elastic resize, and
        for a decode step the wait for a prefill's last cache fills and the guard's choice of arm
        (timing the step that just ended)."""
        if self.elastic is not None:
            slots = self.elastic.poll(self.cache.num_slots)
            if slots is not None:
                self.resize(slots)
        if decode and self.prefill is not None:
            self.prefill.settle()  # the prefill's last cache fills, before decode reads their slots
        if decode and self.guard is not None:
            self.guard.on_decode_call(self.first_layer, self._step_settled(), queued)

    def _step_settled(self) -> bool:
        """Whether the step that just ended ran without one-time graph work (first calls,
        captures), whose cost would be charged to its arm."""
        if self.graphs is None:
            return True
        work = self.one_time_work
        settled, self._graph_work_at_step = work == self._graph_work_at_step, work
        return settled

    @property
    def one_time_work(self) -> int:
        """The CUDA graphs' first calls and captures so far, of layer calls and of whole steps."""
        return (self.graphs.one_time_work if self.graphs is not None else 0) + self.steps.one_time_work

    # -- the split per call ----------------------------------------------------------------------------

    def _pcie_only(self) -> bool:
        """Whether every miss goes over PCIe now ("offload", or "auto" in its PCIe-only arm)."""
        return self.mode == "offload" or (self.guard is not None and self.guard.arm == PCIE_ONLY)

    def _miss_split(self, num_pairs: int, expert_bytes: int) -> tuple[int | torch.Tensor, bool]:
        """How many misses the call may copy over PCIe, and whether any may go to the CPU: all and
        none in PCIe-only (no split table to look up); else the split policy's (SplitTables)."""
        if self._pcie_only():
            return num_pairs, False
        return self.splits.for_call(num_pairs, expert_bytes)

    def _plan_fill_compute(self, layer: int, state: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
                           x: torch.Tensor, expert_ids: torch.Tensor, weights: torch.Tensor,
                           clock: torch.Tensor, n_pcie: int | torch.Tensor, cpu_share: bool,
                           capturing: bool = False) -> tuple[torch.Tensor, RoutePlan, Job | None]:
        """One decode layer call's work, all queued: the output, the plan, and the CPU share's job
        (None without one). `state`: the cache's device (table, owner, last_used); `clock`: its
        device clock, which the plan moves on (ExpertCache.tick). `capturing`: the work is being
        captured into a CUDA graph, so the worker is not handed the job now but on each replay,
        and the output stays float32 (DecodeGraphs casts it to x's dtype as it copies it out, one
        node fewer in the graph); otherwise it is in x's dtype."""
        bank, cache = self.banks[layer], self.cache
        # the kernel holds all T*K pairs in one program's registers: a big batch is planned by the twin (syncs)
        planner = self._route_plan if expert_ids.numel() <= MAX_KERNEL_PAIRS else route_plan_ref
        plan = planner(expert_ids, layer, cache.num_experts, *state, clock, n_pcie,
                       totals=self.counts.of(bank.layout.expert_stride), advance_clock=True)
        job = self.cpu_share.submit(layer, x, expert_ids, weights, plan) if cpu_share else None
        started = self.cpu_share.start(job) if job is not None and not capturing else None
        # the misses' PCIe reads in the slot kernel's launch, overlapping the hits' compute, where it can
        in_launch = self.mode != "cpu" and self._zero_copy[layer] and fills_in_launch(bank.layout, x)
        self._fill(plan, bank, self.pcie_repeat - int(in_launch))
        if self.mode != "cpu":  # the slot experts' launch clears `out` itself (no separate fill of zeros)
            out = torch.empty(x.shape, dtype=torch.float32, device=x.device)
            add_slot_experts(x, plan, weights, cache.slots, cache.views(bank.layout), self.compute_dtype, out,
                             fill_bank=bank.data if in_launch else None, zero_out=True)
        else:
            out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
        if job is not None:
            self.cpu_share.add_result(job, out, started)
        return (out if capturing else out.to(x.dtype)), plan, job

    def _replay(self, layer: int, state: tuple[torch.Tensor, torch.Tensor, torch.Tensor], x: torch.Tensor,
                expert_ids: torch.Tensor, weights: torch.Tensor, clock: torch.Tensor,
                n_pcie: int | torch.Tensor, cpu_share: bool) -> torch.Tensor | None:
        """The call through a CUDA graph (decode_graphs.py); None the first time a key is seen.
        With a CPU share the graph holds its device half, and each replay hands the worker the job."""
        assert self.graphs is not None
        if isinstance(n_pcie, torch.Tensor):  # a split table: the graph reads a buffer of fixed address
            stride = self.banks[layer].layout.expert_stride
            n_pcie, split_key = self.splits.fixed(n_pcie, stride), "table"
        else:
            split_key = n_pcie
        key = (layer, tuple(x.shape), tuple(expert_ids.shape), x.dtype, expert_ids.dtype, weights.dtype, split_key,
               cpu_share)

        def step(sx: torch.Tensor, sids: torch.Tensor,
                 sweights: torch.Tensor) -> tuple[torch.Tensor, Callable[[], object] | None]:
            out, _, job = self._plan_fill_compute(layer, state, sx, sids, sweights, clock, n_pcie, cpu_share,
                                                  capturing=True)
            return out, (lambda: self.cpu_share.start(job)) if job is not None else None

        return self.graphs.run(key, self.cache.generation, step, x, expert_ids, weights)

    def _fill(self, plan: RoutePlan, bank: HostExpertBank, copies: int) -> None:
        """The plan's PCIe fills, made `copies` times (`pcie_repeat` emulates a slower link by
        copying the same bytes again; the slot kernel may make one of them): the zero-copy kernel
        from a pinned bank; else copies planned on the host (a sync: only when pinning was
        refused, or off CUDA where it costs nothing)."""
        for _ in range(copies):
            if self._zero_copy.get(bank.layer, False):
                self._expert_fill(plan, bank.data, self.cache.slots)
            elif self.mode in ("auto", "offload"):
                expert_fill_ref(plan, bank.data, self.cache.slots)

    @property
    def recent_hit_rate(self) -> float:
        """Decode hits over reads, decayed by HIT_RATE_DECAY per layer call (GlobalLRU's measure;
        on CUDA read back without a sync, a few calls late)."""
        return self.splits.hit_rate.value

    @property
    def fill_worth(self) -> float:
        """What a copy is worth: the recent hit rate less the victim's share of it (policy/miss_split.py
        `fill_worth`; GlobalLRU's, with ranks sampled on the same calls), what "auto" prices a copy at
        with fill_pricing "worth"."""
        return self.splits.hit_rate.fill_worth

    # -- residency, size, stats ----------------------------------------------------------------------

    def _make_resident(self, resized: bool = False) -> None:
        """Static split: whole layers resident (pinned slots), filled once from the host banks.
        `resized`: the cache changed size under the layers asked for at load; those that still fit
        stay resident, first ones first (an elastic shrink cannot be refused)."""
        request = self._static_request
        if resized and request is not None:
            fitting = whole_layers_that_fit(self.cache.num_slots, self.banks, request)
            if len(fitting) < len(request):
                log.warning("static split: %d slots no longer hold layers %s; layers %s stay resident",
                            self.cache.num_slots, sorted(request), fitting)
            request = fitting
        self.resident_layers = place_whole_layers(self.cache, self.banks, request)
        log.info("static split: layers %s resident (%d of %d slots)", list(self.resident_layers),
                 int(self.cache.pinned.sum()), self.cache.num_slots)

    def _record(self, key: int) -> torch.Tensor:
        layer, expert = divmod(key, self.cache.num_experts)
        return self.banks[layer].record(expert)

    def resize(self, num_slots: int) -> None:
        """Elastic VRAM: rebuild the cache with `num_slots` slots between steps (the most recently
        used entries that fit stay); no weights are reloaded. Static mode re-places its layers."""
        if self.prefill is not None:
            self.prefill.release()  # a prefetched bank may read slots that move
        shrinking = num_slots < self.cache.num_slots
        self.cache.resize(num_slots, source=self._record)
        if shrinking and self.device.type == "cuda":
            torch.cuda.empty_cache()  # hand the freed slots back to the driver: another program may need them
        if self.mode == "static":
            self._make_resident(resized=True)

    def clear(self) -> None:
        self.cache.clear()
        if self.mode == "static":
            self._make_resident()

    def stats(self) -> ExpertStats:
        """The counters so far (a device sync: the decode counts are summed on the device)."""
        s = replace(self._stats, cpu_ms=self.cpu_share.cpu_ms, cpu_wait_ms=self.cpu_share.wait_ms)
        self.counts.add_to(s)
        return s

    def reset_stats(self) -> None:
        self.cpu_share.drain()
        self._stats = ExpertStats()
        self.counts.zero()
        self.cpu_share.reset_counters()

    def close(self) -> None:
        """The end of the executor: its worker stops, and its graphs, prefill buffers and cache
        slots are given back now (not whenever the garbage collector reaches it: the executor
        holds reference cycles, and a model loaded after this one may be capturing graphs then)."""
        self.steps.invalidate()
        if self.graphs is not None:
            # a CUDA graph destroyed during another executor's capture invalidates that capture and
            # aborts the process, as ft bench did on the H200; first, so no replay reads what follows
            self.graphs.invalidate()
        self.cpu_share.close()  # (its staging buffers: the same hazard, cpu_share.py)
        if self.prefill is not None:
            self.prefill.release()
        self.cache.release()  # (ft bench at 32 GiB ran out of device memory holding four closed executors' slots)
