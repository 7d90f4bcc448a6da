"""Whole decode steps as one CUDA graph each: every layer's attention, router and expert calls
captured once and replayed for each token (on by default with `cuda_graphs`).

Per-layer graphs (decode_graphs.py) leave the host a copy, a launch and a copy-out per layer
call, plus whatever runs between the calls: in a model, each layer's norms, attention, router
and residual adds, dozens of eager ops. Captured whole, a step costs the host one replay.

What a step needs to be captured, and who provides it:
- the step's inputs in buffers of fixed address, filled by the caller before `run`: the token
  and its position for a model (DeviceModel, whose attention reads a DevicePosition), the
  routed ids and activations for `ft bench`;
- the executor's host part of the step made outside the graph, once per step, before the
  replay (`HybridExpertExecutor.begin_step`: an elastic resize, the guard's arm, the cache's
  host-side changes uploaded) and after it (`end_step`: the host's copy of the cache clock,
  the counters, the hit rate's read-back);
- a call's CPU share (auto's model arm, the CPU-served modes) is captured where the driver's
  stream flags can be (host_signal.py): the graph holds the device half of every call, and
  before each replay the worker is handed the step's jobs in call order (each waits for its
  call's `ready` flag, which the graph writes). Without such flags `begin_step` answers None and
  the step runs as it is, each layer call through its own graph where it can be.

A step can also be queued before its inputs are known (`queue`, for a decode loop whose next
token is still being made): where its graph is captured, its host part and its replay are made
at once, held on the device by a Doorbell (host_signal.py) until the caller has written the
inputs and starts it, so the launches overlap the step before instead of following it.

A key's first step runs uncaptured (kernels compile, buffers are allocated); the second
captures and replays. Graphs are dropped when the cache is rebuilt (its addresses move) and
when the caller's buffers change (`invalidate`). A capture put off (CaptureLater) is tried again
ever more rarely while it keeps being put off (`CaptureBackoff`): each failed try costs a
partial capture on top of the uncaptured step. So is one that failed with an error other than
StepNotCapturable (an op that synced, say: it may not do so every step); a StepNotCapturable
key runs uncaptured for good.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Hashable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

import torch

from .decode_graphs import collector_off, fresh_pool_after_failure
from .kernels.dependent_launch import for_step_graph

if TYPE_CHECKING:  # pragma: no cover
    from .cpu_share import CPUShare
    from .decode_graphs import DecodeGraphs
    from .expert_cache import ExpertCache
    from .host_signal import Doorbell

log = logging.getLogger(__name__)
Out = TypeVar("Out")


class StepNotCapturable(RuntimeError):
    """A layer call of the step cannot run inside a captured graph (it needs the host)."""


class CaptureLater(StepNotCapturable):
    """A layer call of the step needs host work first that the executor makes at its next
    `begin_step` (a split table's copy): this step runs layer by layer, the next is captured."""


@dataclass
class StepCapture:
    """What the executor's calls left while a step was captured: how many, and the host work
    each replay needs first (handing the CPU shares' jobs to the worker, in call order)."""

    count: int = 0
    host_work: list[Callable[[], object]] = field(default_factory=list)
    native_jobs: set[bool] = field(default_factory=set)  # whether each CPU share went to the native worker


@dataclass
class _Captured:
    graph: torch.cuda.CUDAGraph
    out: Any  # what the step returned at capture: its output buffers, rewritten by each replay
    capture: StepCapture  # its calls, and the host work each replay runs first


class QueuedStep(Generic[Out]):
    """A decode step queued by `StepGraphs.queue`: `start` it once its inputs are in place (it
    releases the held replay, or runs the step then), which returns the step's outputs; or
    `cancel` it. One of the two, once: a held replay holds the stream until released, so a
    cancelled one is released too and runs, its outputs unread."""

    def __init__(self, start: Callable[[], Out], cancel: Callable[[], object]) -> None:
        self._start: Callable[[], Out] | None = start
        self._cancel = cancel

    def start(self) -> Out:
        if self._start is None:
            raise RuntimeError("this queued step was started or cancelled already")
        start, self._start = self._start, None
        return start()

    def cancel(self) -> None:
        if self._start is not None:
            self._start = None
            self._cancel()


class CaptureBackoff:
    """When a key whose capture was put off is tried again: at its next step, then after 2, 4, ...
    up to MAX_GAP steps while it keeps being put off. A put-off try runs the step under capture
    until the call that cannot be captured, then the whole step uncaptured: on the H200 a
    16-layer race model whose captures kept being put off decoded at 30 tok/s against 220 with
    its graphs (BENCHMARKS.md). Pure bookkeeping over step counts, so it is tested on the CPU."""

    MAX_GAP = 256

    def __init__(self) -> None:
        self._step = 0
        self._next: dict[Hashable, tuple[int, int]] = {}  # key: (the step it may be tried at, the gap after that)

    def tick(self) -> None:
        """A step ran (whichever key)."""
        self._step += 1

    def due(self, key: Hashable) -> bool:
        at = self._next.get(key)
        return at is None or self._step >= at[0]

    def put_off(self, key: Hashable) -> None:
        _, gap = self._next.get(key, (0, 1))
        self._next[key] = (self._step + gap, min(2 * gap, self.MAX_GAP))

    def captured(self, key: Hashable) -> None:
        self._next.pop(key, None)

    def clear(self) -> None:
        self._next.clear()


class StepExecutor(Protocol):
    """What StepGraphs needs of the expert executor whose layer calls a step makes (the
    HybridExpertExecutor, through executor_steps.WholeStepCalls): its host part of a step before
    and after each replay, and where its state lives. A protocol, so that this module does not
    import the executor that owns it."""

    device: torch.device
    cache: ExpertCache
    cpu_share: CPUShare
    graphs: DecodeGraphs | None  # per-layer-call graphs; None where CUDA graphs are off
    step_graphs: bool  # whole-step capture asked for

    def begin_step(self, queued: bool = False) -> Hashable | None: ...
    def abandon_step(self) -> None: ...
    def capturing_step(self) -> AbstractContextManager[StepCapture]: ...
    def end_step(self, calls: int) -> None: ...


class StepGraphs:
    """Decode steps by key, replayed from their graph where the executor's calls allow it."""

    def __init__(self, executor: StepExecutor) -> None:
        self.executor = executor
        self._graphs: dict[Hashable, _Captured] = {}
        self._warm: set[Hashable] = set()  # keys that ran once uncaptured
        self._refused: set[Hashable] = set()  # keys whose capture hit a call that needs the host
        self._pool = None
        self._generation: int | None = None
        self.replays = self.captures = self.first_calls = 0
        self.put_off = self.refused = 0  # captures put off (CaptureLater) and refused (an error), so far
        self._backoff = CaptureBackoff()
        self._doorbell: Doorbell | None = None

    def run(self, key: Hashable, step: Callable[[], Out]) -> Out:
        """One decode step: `step` makes its calls, reading inputs the caller put in buffers of
        fixed address. Replayed, it returns the outputs it returned at capture, rewritten in
        place (valid until this key runs again); else it runs as it is."""
        return self._execute(self._begin(key), step)

    def queue(self, key: Hashable, step: Callable[[], Out], feed: Callable[[], object],
              bell: Doorbell | None) -> QueuedStep[Out]:
        """One decode step queued before its inputs are known, while the step before it may still
        run: the step's host part is made now, and where the key's graph is captured, its replay
        is launched now, held on the device by `bell` behind `feed` (which queues the copies of
        the inputs into the step's buffers, from where the host will have written them). Where
        it is not (a first step, a capture, a step that runs uncaptured, no bell), `feed` and
        the step run when the step is started. Either way, `QueuedStep.start` once the inputs
        are in place; its outputs are valid as `run`'s."""
        full_key = self._begin(key, queued=True)
        captured = self._graphs.get(full_key) if full_key is not None and bell is not None else None
        if captured is None:  # cancelled, it never runs
            return QueuedStep(lambda: (feed(), self._execute(full_key, step))[1], self.executor.abandon_step)
        self._replay(captured, held=lambda: (bell.hold(), feed()))
        ticket = bell.count
        return QueuedStep(lambda: (bell.ring(ticket), captured.out)[1], lambda: bell.ring(ticket))

    def _begin(self, key: Hashable, queued: bool = False) -> Hashable | None:
        """The executor's host part of the step; the step's graph key, or None where it cannot be
        captured (it runs as it is)."""
        self._backoff.tick()
        device_key = self.executor.begin_step(queued)
        if device_key is None:
            return None
        generation = self.executor.cache.generation
        if generation != self._generation:  # the cache was rebuilt: the graphs hold its old addresses
            self.invalidate()
            self._generation = generation
        return key, device_key

    def _execute(self, key: Hashable | None, step: Callable[[], Out]) -> Out:
        if key is None or key in self._refused:
            return step()
        if key not in self._warm:
            self._warm.add(key)
            self.first_calls += 1
            with for_step_graph():  # the kernels the capture will launch, compiled now
                return step()
        captured = self._graphs.get(key)
        if captured is None:
            if not self._backoff.due(key):
                return step()
            try:
                captured = self._capture(step)
            except CaptureLater as e:
                log.log(logging.INFO if self.put_off == 0 else logging.DEBUG, "decode step %s is captured later: %s",
                        key, e)
                self.put_off += 1
                self._backoff.put_off(key)
                return step()
            except StepNotCapturable as e:  # a call that needs the host: so will this key's every step
                log.info("decode step %s runs layer by layer: %s", key, e)
                self.refused += 1
                self._refused.add(key)
                return step()
            except RuntimeError as e:  # an op that syncs, one CUDA cannot capture: maybe not every time
                log.warning("decode step %s runs layer by layer for now (its capture is tried again later): %s",
                            key, e)
                self.refused += 1
                self._backoff.put_off(key)
                return step()
            self._backoff.captured(key)
            self._graphs[key] = captured
            self.captures += 1
        self._replay(captured)
        return captured.out

    def _replay(self, captured: _Captured, held: Callable[[], object] | None = None) -> None:
        """The replay and the executor's host part around it. `held`: queues what holds the replay
        on the device and the copies of its inputs, right before it."""
        for work in captured.capture.host_work:  # before the replay: a replay made synchronous waits for the worker
            work()  # (each job waits for its call's flag, which the graph writes)
        if held is not None:
            held()
        captured.graph.replay()
        self.executor.end_step(captured.capture.count)
        self.replays += 1

    @property
    def doorbell(self) -> Doorbell | None:
        """A Doorbell on the executor's stream flags, for `queue` (None where the driver has no
        stream memory operations: steps are then run when started)."""
        if self._doorbell is None:
            flags = self.executor.cpu_share.flags
            if flags is not None:
                from .host_signal import Doorbell

                self._doorbell = Doorbell(flags)
        return self._doorbell

    @property
    def enabled(self) -> bool:
        """Whether a step can be captured at all here (CUDA graphs on, with triton; step graphs on)."""
        return self.executor.graphs is not None and self.executor.step_graphs

    def counters(self) -> dict[str, int]:
        """What the steps did so far: replays, captures, first (uncaptured) calls, captures put
        off and refused. A decode rate far below its kind's is explained here."""
        return {"replays": self.replays, "captures": self.captures, "first_calls": self.first_calls,
                "put_off": self.put_off, "refused": self.refused}

    @property
    def one_time_work(self) -> int:
        """First steps and capture tries so far, made or not (a step that moved it paid costs later
        steps will not, or not as often: the guard does not time it)."""
        return self.first_calls + self.captures + self.put_off + self.refused

    def _capture(self, step: Callable[[], Out]) -> _Captured:
        if self._doorbell is not None:  # a capture waits for the device first
            self._doorbell.check_released("a step graph capture")
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        try:
            with self.executor.capturing_step() as capture, collector_off(), for_step_graph(), \
                    torch.cuda.graph(graph, pool=self._pool, capture_error_mode="thread_local"):
                out = step()
        except BaseException:
            self._pool = fresh_pool_after_failure(self._pool, held=bool(self._graphs))
            raise
        return _Captured(graph, out, capture)

    def invalidate(self) -> None:
        """Drop every graph and its memory pool (as DecodeGraphs.invalidate: no replay in flight
        reads what is freed, and a later capture gets a new pool)."""
        if self._graphs:
            if self._doorbell is not None:
                self._doorbell.check_released("dropping the step graphs")
            torch.cuda.synchronize(self.executor.device)
        self._graphs.clear()
        self._warm.clear()
        self._refused.clear()
        self._backoff.clear()
        self._pool = None
