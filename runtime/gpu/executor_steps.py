"""The executor's side of a whole decode step run as one CUDA graph (step_graphs.py).

StepGraphs asks the executor, before each step, whether its layer calls can be captured and
under which key (`begin_step`); captures them with `capturing_step` around the model's forward,
each call then queuing device work only (`_decode_captured`); and after each replay hands the
executor the host part of those calls (`end_step`). Kept apart from the per-call decode path
(executor.py), which it shares: the split lookup, the plan, fill and compute of one call.
"""

from __future__ import annotations

import contextlib
from collections.abc import Hashable, Iterator

import torch

from .kernels import MAX_KERNEL_PAIRS
from .step_graphs import CaptureLater, StepCapture, StepNotCapturable


class WholeStepCalls:
    """Mixed into HybridExpertExecutor: its state (`steps`, `splits`, `cache`, `counts`,
    `cpu_share`, the `_step_*` fields) and its call path (`_start_step`, `_miss_split`,
    `_plan_fill_compute`, `_cast_out`) are the executor's."""

    def begin_step(self, queued: bool = False) -> Hashable | None:
        """A decode step begins: the host part of its first call is made now, so that all its
        calls may run inside one captured graph. Returns the key of the device work they would
        queue, or None where they cannot be captured (graphs off, a bank not pinned, a CPU
        share without stream flags a graph can capture); run them as usual then. `queued`: the
        step is begun while the one before it runs (the guard's timing lags a step)."""
        self._start_step(decode=True, queued=queued)
        self._step_begun = True
        if not self.steps.enabled or not all(self._zero_copy.values()) \
                or not (self._pcie_only() or self.cpu_share.capturable):
            return None
        self._step_state = self.cache.device_state()  # uploaded now: nothing may be copied from the host inside
        # whether the step's calls carry a CPU share: none in PCIe-only, else as the split tables say
        self._step_cpu = not self._pcie_only() and self._step_tables_use_cpu()
        return ("pcie" if self._pcie_only() else self.mode), self._step_cpu, self.pcie_repeat

    def _step_tables_use_cpu(self) -> bool:
        """Whether a split table that captured steps read sends a miss to the CPU now (unknown
        before the first capture: True). Each one's graphs' copy is brought up to date here,
        outside any capture (the split moves with the hit rate)."""
        if not self._step_tables:
            return True
        uses = []
        for pairs, stride in self._step_tables:
            table, uses_cpu = self.splits.for_call(pairs, stride)
            if isinstance(table, torch.Tensor):
                self.splits.fixed(table, stride)
            uses.append(uses_cpu)
        return any(uses)

    def abandon_step(self) -> None:
        """A step begun by `begin_step` will not run (queued for a token that did not come): its
        first call's host part is not taken as made."""
        self._step_begun = False

    @contextlib.contextmanager
    def capturing_step(self) -> Iterator[StepCapture]:
        """While a step begun by `begin_step` is captured: its calls queue device work only,
        counted, with the host work each replay needs first (StepNotCapturable from a call
        that cannot be captured)."""
        self._step_capture = capture = StepCapture()
        try:
            yield capture
        finally:
            self._step_capture = None

    def end_step(self, calls: int) -> None:
        """After a captured step's replay: the host's part of its `calls` layer calls (the host's
        copy of the cache clock, the counters, the hit rate's read-back)."""
        self._step_begun = False
        self.cache.tick(calls)
        self._stats.calls += calls
        self._stats.tokens += calls
        if self.mode == "auto":
            self.splits.hit_rate.observe(None, self.counts.all(), calls)

    def _decode_captured(self, layer: int, x: torch.Tensor, expert_ids: torch.Tensor,
                         weights: torch.Tensor) -> torch.Tensor:
        """A one-token call inside a whole step's capture: the misses over PCIe filled in the
        launch, the CPU's share handed to the worker by the replay's host work."""
        num_pairs, capture = expert_ids.numel(), self._step_capture
        assert capture is not None
        stride = self.banks[layer].layout.expert_stride
        if x.shape[0] != 1 or num_pairs > MAX_KERNEL_PAIRS or self.counts.made(stride) is None \
                or self._step_state is None:
            raise StepNotCapturable(f"layer {layer}: {x.shape[0]} tokens, {num_pairs} routed experts, "
                                    "or its counters not made yet")
        n_pcie, uses_cpu = self._miss_split(num_pairs, stride)
        if isinstance(n_pcie, torch.Tensor):  # a split table: the graph reads a copy of fixed address
            self._step_tables.add((num_pairs, stride))  # begin_step brings the copy up to date from now on
            fixed = self.splits.fixed_if_current(n_pcie, stride)
            if fixed is None:  # a copy made now would be captured, and every replay would make it again
                raise CaptureLater(f"layer {layer}: its split table changed since the step began")
            n_pcie = fixed
        cpu_share = self._step_cpu or num_pairs > self.cache.num_slots
        if uses_cpu and not self._step_cpu:
            raise CaptureLater(f"layer {layer}: its split sends misses to the CPU, the step's calls were "
                               "to carry no CPU share")
        if cpu_share and not self.cpu_share.capturable:
            raise StepNotCapturable(f"layer {layer}: a CPU share, and no stream flags a graph can capture")
        out, _, job = self._plan_fill_compute(layer, self._step_state, x, expert_ids, weights,
                                              self.cache.device_clock, n_pcie, cpu_share, capturing=True)
        if job is not None:
            capture.native_jobs.add(job.native is not None)
            if len(capture.native_jobs) > 1:
                # a replay hands over all its jobs before it runs, and a job for one worker first
                # waits for the other's, which wait for flags only the replay writes
                raise StepNotCapturable(f"layer {layer}: the step's CPU shares would go to both the native "
                                        "worker and the Python one")
            capture.host_work.append(lambda: self.cpu_share.start(job))
        capture.count += 1
        return self._cast_out(out, x.dtype)  # a link of the step graph's PDL chain (kernels/cast_out.py)
