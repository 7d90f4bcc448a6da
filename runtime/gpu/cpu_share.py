"""The CPU's share of a decode layer: the misses the route plan left to the CPU, computed on a
worker thread straight from the host banks while the device works, with no wait on the thread
that launches the device work.

Per layer call the launching thread (`submit`) queues, on a side stream after the route plan,
copies of the layer's inputs and plan into pinned staging buffers and an event; the worker
waits for that event, runs the CPU kernel over the pairs whose expert the plan marked CPU,
writes the sum into pinned memory and bumps a host flag. `add_result` makes the device stream
wait for the flag (host_signal.StreamWaiter) and adds the copied-up result: the launching
thread has gone on to queue the next layers long before. Where stream waits are unavailable
(or off CUDA) `add_result` waits on the host instead.

Staging buffers are reused per token count without races: the next call's copies into them run
after the device passed this call's flag wait (stream order), that is after the worker is done.
"""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import torch

from ..experts import ExpertExecutor
from .host_signal import HostFlag, StreamWaiter
from .kernels import CPU, RoutePlan


@dataclass
class _Staging:
    """Pinned host copies of one call's inputs, and the CPU result."""

    x: torch.Tensor
    ids: torch.Tensor
    weights: torch.Tensor
    status: torch.Tensor
    inverse: torch.Tensor
    result: torch.Tensor


@dataclass
class Pending:
    future: Future
    staging: _Staging
    value: int


class CPUShare:
    """Runs the CPU-marked pairs of each decode call on one worker thread (see the module doc)."""

    def __init__(self, cpu_executor: ExpertExecutor, device: torch.device) -> None:
        self.cpu_executor, self.device = cpu_executor, device
        # the executor's kernel entry that selects the CPU pairs itself, where it has one
        self._forward_selected = getattr(cpu_executor, "forward_selected", None)
        self.is_cuda = device.type == "cuda"
        self.waiter = StreamWaiter.load(device) if self.is_cuda else None
        self.flag = HostFlag(pinned=self.is_cuda)
        self._issued = 0
        self._side = torch.cuda.Stream(device) if self.is_cuda else None
        self._staging: dict[tuple, _Staging] = {}
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="ft-cpu-experts")
        self._last: Pending | None = None
        self._error: BaseException | None = None  # a worker failure, raised on the launching thread
        self.cpu_ms = 0.0  # the CPU kernel's time on the worker
        self.wait_ms = 0.0  # host waits for the worker (only without stream waits)

    def submit(self, layer: int, x: torch.Tensor, expert_ids: torch.Tensor, weights: torch.Tensor,
               plan: RoutePlan) -> Pending:
        self._raise_worker_error()
        inputs = (x, expert_ids, weights, plan.status, plan.inverse)
        if self.is_cuda:
            staging = self._staging_for(x, expert_ids, weights, plan)
            current = torch.cuda.current_stream(self.device)
            self._side.wait_stream(current)
            with torch.cuda.stream(self._side):
                for dst, src in zip((staging.x, staging.ids, staging.weights, staging.status, staging.inverse),
                                    inputs, strict=True):
                    dst.copy_(src, non_blocking=True)
                    src.record_stream(self._side)
                ready = torch.cuda.Event()
                ready.record(self._side)
        else:  # the CPU device: the inputs are host tensors already, alive until add_result
            staging = _Staging(*(t.contiguous() for t in inputs),
                               result=torch.empty(x.shape, dtype=torch.float32, device="cpu"))
            ready = None
        self._issued = self._issued % 0xFFFFFFFF + 1
        pending = Pending(self._pool.submit(self._run, layer, staging, ready, self._issued), staging, self._issued)
        self._last = pending
        return pending

    def add_result(self, pending: Pending, out: torch.Tensor) -> None:
        """out += the CPU share of `pending` (queued on the device stream; the host waits only
        where stream waits are unavailable)."""
        if self.waiter is not None:
            self.waiter.wait(self.flag, pending.value)
        else:
            start = time.perf_counter()
            pending.future.result()
            self.wait_ms += (time.perf_counter() - start) * 1e3
        out += pending.staging.result.to(out.device, non_blocking=True)

    def _staging_for(self, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor, plan: RoutePlan) -> _Staging:
        key = (tuple(x.shape), tuple(ids.shape), tuple(plan.status.shape), x.dtype, ids.dtype, weights.dtype)
        staging = self._staging.get(key)
        if staging is None:
            def pinned(like: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
                return torch.empty(like.shape, dtype=dtype or like.dtype, device="cpu", pin_memory=True)

            staging = self._staging[key] = _Staging(pinned(x), pinned(ids), pinned(weights), pinned(plan.status),
                                                    pinned(plan.inverse), pinned(x, torch.float32))
        return staging

    def _run(self, layer: int, s: _Staging, ready: torch.cuda.Event | None, value: int) -> None:
        try:
            with torch.inference_mode():  # a worker thread: no autograd; the inputs may be inference tensors
                if ready is not None:
                    ready.synchronize()
                start = time.perf_counter()
                self._compute_into(layer, s)
                self.cpu_ms += (time.perf_counter() - start) * 1e3
        except BaseException as e:
            self._error = e
            raise
        finally:
            self.flag.set(value)  # always: a device stream is waiting for it

    def _compute_into(self, layer: int, s: _Staging) -> None:
        """s.result = the sum over the CPU-marked pairs of each token (zeros where there are none):
        in one kernel call where the executor has one (no torch op: on the H200 host the selection
        below cost ~0.4 ms a call, more than a 9 MB expert's read), else selected here."""
        if self._forward_selected is not None and self._forward_selected(layer, s.x, s.ids, s.weights, s.status,
                                                                         s.inverse, CPU, s.result):
            return
        s.result.copy_(self._compute(layer, s))

    def _compute(self, layer: int, s: _Staging) -> torch.Tensor:
        """The sum over the CPU-marked pairs of each token (zeros where there are none)."""
        mask = s.status[s.inverse.long()] == CPU  # [T, K]: pairs whose expert the CPU computes
        if not bool(mask.any()):
            return torch.zeros_like(s.result)
        width = int(mask.sum(dim=1).max())
        order = torch.argsort((~mask).to(torch.int8), dim=1, stable=True)[:, :width]  # CPU pairs first
        keep = mask.gather(1, order)
        ids = s.ids.to(torch.int64)
        pad = ids[mask][0]  # tokens with fewer CPU pairs: an expert the kernel streams anyway, weight 0
        cpu_ids = torch.where(keep, ids.gather(1, order), pad)
        cpu_weights = s.weights.gather(1, order) * keep
        return self.cpu_executor(layer, s.x, cpu_ids, cpu_weights)

    def _raise_worker_error(self) -> None:
        error, self._error = self._error, None
        if error is not None:
            raise RuntimeError("the CPU expert worker failed") from error

    def drain(self) -> None:
        """Wait for the queued CPU work (and raise its error)."""
        if self._last is not None:
            self._last.future.exception()  # waits; the error itself is raised below
        self._raise_worker_error()

    def close(self) -> None:
        self._pool.shutdown(wait=True)
