"""CUDA graphs of decode layer calls (on by default: executor option `cuda_graphs`).

A decode layer call is about eight launches (the route plan, the PCIe fills, the slot experts;
with a CPU share, the staging copies and the stream flags) that cost the host ~0.3-0.5 ms a
layer, more than the device needs once most experts hit. Captured once per (layer, tokens,
split, CPU share or not) and replayed, it costs one copy of the inputs and one graph launch.

What a replay needs, and how it gets it:
- inputs: copied into the graph's own buffers before each replay (stream-ordered);
- the cache clock: kept on the device, where the graph's route plan moves it on by one
  (ExpertCache.tick): the host writes nothing and waits for nothing per replay;
- the cache's tensors: their addresses are baked in, so graphs are dropped whenever the cache
  is rebuilt (resize: `ExpertCache.generation`);
- host work: a step may return a function to run on each replay (the CPU share hands its
  worker the call: the graph holds only the device half);
- the output: the graph's own float32 buffer, cast to the inputs' dtype as it is copied out (so
  a caller may keep it, and the graph has no cast node of its own).

A key's first call runs uncaptured (Triton compiles, buffers are allocated); the second captures
and replays. On the H200 at a host-bound 32 GiB budget, offload decode went from 52 to 124 tok/s
(docs/benchmark-history.md); `ft bench --no-cuda-graphs` runs the uncaptured path.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass

import torch

HostWork = Callable[[], object]
# (x, ids, weights) -> (float32 output, host work to run on each replay or None)
Step = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], tuple[torch.Tensor, HostWork | None]]


@dataclass
class _Captured:
    graph: torch.cuda.CUDAGraph
    x: torch.Tensor
    ids: torch.Tensor
    weights: torch.Tensor
    out: torch.Tensor
    host_work: HostWork | None


class DecodeGraphs:
    """Captured decode layer calls by key; `run` replays one, or returns None (run it uncaptured)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._graphs: dict[Hashable, _Captured] = {}
        self._warm: set[Hashable] = set()  # keys that ran once uncaptured
        self._pool = None
        self._generation: int | None = None
        self.replays = 0
        self.captures = 0
        self.first_calls = 0  # keys run uncaptured on first sight

    def run(self, key: Hashable, generation: int, step: Step, x: torch.Tensor, ids: torch.Tensor,
            weights: torch.Tensor) -> torch.Tensor | None:
        if generation != self._generation:  # the cache was rebuilt: its addresses changed
            self.invalidate()
            self._generation = generation
        if key not in self._warm:
            self._warm.add(key)
            self.first_calls += 1
            return None
        captured = self._graphs.get(key)
        if captured is None:
            captured = self._graphs[key] = self._capture(step, x, ids, weights)
            self.captures += 1
        # one dispatch for the three copies (a torch op on CUDA costs the host several microseconds)
        torch._foreach_copy_([captured.x, captured.ids, captured.weights], [x, ids, weights])
        if captured.host_work is not None:  # before the replay: a replay made synchronous (CUDA_LAUNCH_BLOCKING) waits for it
            captured.host_work()
        captured.graph.replay()
        self.replays += 1
        return captured.out.to(captured.x.dtype, copy=True)

    def _capture(self, step: Step, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor) -> _Captured:
        static_x, static_ids, static_weights = x.clone(), ids.clone(), weights.clone()
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        try:
            with collector_off(), torch.cuda.graph(graph, pool=self._pool, capture_error_mode="thread_local"):
                out, host_work = step(static_x, static_ids, static_weights)
        except BaseException:
            self._pool = fresh_pool_after_failure(self._pool, held=bool(self._graphs))
            raise
        return _Captured(graph, static_x, static_ids, static_weights, out, host_work)

    @property
    def one_time_work(self) -> int:
        """First calls and captures so far: a step that moved it paid costs a later step will not."""
        return self.first_calls + self.captures

    def invalidate(self) -> None:
        """Drop every graph, and their memory pool with them: a later capture gets a new pool.
        (Capturing into a pool whose graphs were all destroyed lets torch free its blocks at the
        next empty_cache, which every capture runs, while the new graphs still use them.)"""
        if self._graphs:
            torch.cuda.synchronize(self.device)  # no replay in flight reads what is freed
        self._graphs.clear()
        self._warm.clear()
        self._pool = None


def fresh_pool_after_failure(pool: tuple[int, int] | None, *, held: bool) -> tuple[int, int] | None:
    """The pool the next capture should use after one failed in `pool`. A failed capture gives
    back its reference to the pool; where no captured graph `held` one, the pool is left with
    none, and torch's allocator asserts (`use_count > 0`) on the next capture into it: on the
    H200 one capture put off at its first try made every later one in the race fail so, and
    the decode ran layer by layer at 31 tok/s where it had run at 285. So such a pool is
    dropped (torch frees its blocks once nothing uses them) and the next capture gets a new one."""
    return pool if held else None


@contextlib.contextmanager
def collector_off() -> Iterator[None]:
    """Python's garbage collector off for a capture (torch.cuda.graph collects just before it
    begins). A collection inside a capture runs the destructors of whatever it frees there: on
    the H200, freeing a closed executor's pinned buffers or events inside a capture aborted the
    process (torch's pinned allocator records a release event on the capturing stream)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
