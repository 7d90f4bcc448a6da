"""The CPU's share of a decode layer: the misses the route plan left to the CPU, computed on a
worker thread straight from the host banks while the device works, with no wait on the thread
that launches the device work.

A call is a `Job` in two halves. The device half (`submit`, then `add_result`), queued on the
current stream after the route plan: copies of the layer's inputs and plan into pinned staging
buffers, a write of the `ready` flag; later (after the device's own share) a wait for the `done`
flag, its reset, and the add of the copied-up result. The host half (`start`): the worker is
handed the job, waits for `ready`, clears it, runs the CPU kernel over the pairs whose expert
the plan marked CPU, writes the sum into pinned memory and sets `done`. One pair of flags serves
every call: the next call's `ready` is written only after the device passed this call's `done`.

With flags, the worker is the kernel library's own thread (cpu_kernels.ShareWorker), which never
takes the GIL: a Python worker needs it after the wait and before `done`, and the launching
thread holds it, so the device waited for Python (+77-80 us a call on the H200 host, against
+27-60 native: benchmarks/bench_handoff.py). Calls the kernel does not run go to a Python worker once
the native one has finished the earlier calls (the two share the flags).

With stream memory operations that CUDA graphs capture (host_signal.StreamFlags), the device
half is captured with the rest of the call and each replay hands the worker the same job again
(executor, decode_graphs.py). Without stream memory operations the inputs are copied on a side
stream, the worker waits for an event, and `add_result` waits on the host; off CUDA the worker
reads the inputs in place.

Staging buffers are reused per shape without races: the next call's copies into them run
after the device passed this call's `done` wait (stream order), that is after the worker is done.
"""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import torch

from ..experts import ExpertExecutor
from ..experts.cpu_kernels import ShareJob, ShareWorker, native_kernel
from .host_signal import HostFlag, StreamFlags
from .kernels import CPU, RoutePlan

WAIT_TIMEOUT_S = 60.0  # the worker's wait for a call's inputs: far beyond any queue of decode work


@dataclass
class _Staging:
    """Pinned host copies of one call's inputs, and the CPU result."""

    x: torch.Tensor
    ids: torch.Tensor
    weights: torch.Tensor
    status: torch.Tensor
    inverse: torch.Tensor
    result: torch.Tensor


@dataclass(frozen=True)
class Job:
    """One call's CPU share: the layer, its staging, and (without stream flags) the event after
    the inputs' copies."""

    layer: int
    staging: _Staging
    ready_event: torch.cuda.Event | None = None
    native: ShareJob | None = None  # the job for the native share worker, where the kernel runs it


class CPUShare:
    """Runs the CPU-marked pairs of each decode call on one worker thread (see the module doc)."""

    def __init__(self, cpu_executor: ExpertExecutor, device: torch.device, flags: StreamFlags | None = None,
                 native: bool = True) -> None:
        """`flags`: the stream flags to hand calls over with (default: the driver's, probed on
        CUDA; off CUDA none, so the launching thread waits for the worker). `native`: with flags,
        jobs the kernel runs go to the native worker (False: all to the Python one)."""
        self.cpu_executor, self.device = cpu_executor, device
        # the executor's kernel entry that selects the CPU pairs itself, where it has one
        self._forward_selected = getattr(cpu_executor, "forward_selected", None)
        self.is_cuda = device.type == "cuda"
        self.flags = flags or (StreamFlags.load(device) if self.is_cuda else None)
        # whether a CUDA graph may capture a call's device half
        self.capturable = self.flags is not None and self.flags.capturable
        self.ready, self.done = HostFlag(pinned=self.is_cuda), HostFlag(pinned=self.is_cuda)
        self._side = torch.cuda.Stream(device) if self.is_cuda and self.flags is None else None
        self._staging: dict[tuple, _Staging] = {}
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="ft-cpu-experts")
        self._last: Future | None = None
        # with flags, jobs the kernel runs go to the native worker (no GIL on the device's path)
        self._selected_job = getattr(cpu_executor, "selected_job", None) if self.flags is not None and native else None
        self._native: ShareWorker | None = None
        self._native_pending = False  # jobs pushed to the native worker since its last drain
        self._error: BaseException | None = None  # a worker failure, raised on the launching thread
        self._python_cpu_ms = 0.0  # the CPU kernel's time on the Python worker
        self._native_busy_base = 0.0  # the native worker's busy time at the last reset_counters
        self.wait_ms = 0.0  # host waits for the worker (only without stream flags)

    def submit(self, layer: int, x: torch.Tensor, expert_ids: torch.Tensor, weights: torch.Tensor,
               plan: RoutePlan) -> Job:
        """Queue the call's inputs for the worker (the device half: capturable with stream flags).
        The worker is handed the job by `start`."""
        self._raise_worker_error()
        inputs = (x, expert_ids, weights, plan.status, plan.inverse)
        if self.flags is None and not self.is_cuda:  # the inputs are host tensors already, alive until add_result
            return Job(layer, _Staging(*(t.contiguous() for t in inputs),
                                       result=torch.empty(x.shape, dtype=torch.float32, device="cpu")))
        staging = self._staging_for(x, expert_ids, weights, plan)
        targets = (staging.x, staging.ids, staging.weights, staging.status, staging.inverse)
        if self.flags is not None:
            for dst, src in zip(targets, inputs, strict=True):
                dst.copy_(src, non_blocking=self.is_cuda)
            self.flags.write(self.ready, 1)
            return Job(layer, staging, native=self._native_job(layer, staging))
        self._side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self._side):
            for dst, src in zip(targets, inputs, strict=True):
                dst.copy_(src, non_blocking=True)
                src.record_stream(self._side)
            ready = torch.cuda.Event()
            ready.record(self._side)
        return Job(layer, staging, ready)

    def start(self, job: Job) -> Future | None:
        """Hand `job` to the worker (once per run of its device half: per replay when captured).
        The native worker and the Python one share the flags, so a job goes to one only after the
        other's are done (those calls' device halves are queued already: no deadlock)."""
        if job.native is not None:
            if self._last is not None:
                self._last.exception()  # waits; an error is raised by the next submit
            self._raise_worker_error()
            self._native.push(job.native)
            self._native_pending = True
            return None
        self._drain_native()
        self._last = self._pool.submit(self._run, job)
        return self._last

    @property
    def native_worker_started(self) -> bool:
        """Whether a job has gone to the native worker."""
        return self._native is not None

    def _native_job(self, layer: int, s: _Staging) -> ShareJob | None:
        """The job for the native share worker where the CPU executor's kernel runs this call."""
        if self._selected_job is None:
            return None
        job = self._selected_job(layer, s.x, s.ids, s.weights, s.status, s.inverse, CPU, s.result,
                                 self.ready.address, self.done.address, WAIT_TIMEOUT_S)
        if job is not None and self._native is None:
            kernel = native_kernel()
            if kernel is None:
                return None
            self._native = ShareWorker(kernel)
        return job

    def _drain_native(self) -> None:
        if self._native_pending:
            if not self._native.drain(WAIT_TIMEOUT_S):
                raise TimeoutError(f"the CPU share's native worker did not finish in {WAIT_TIMEOUT_S} s")
            self._native_pending = False
            self._raise_worker_error()

    def add_result(self, job: Job, out: torch.Tensor, started: Future | None) -> None:
        """out += the CPU share of `job` (queued on the device stream; the host waits for
        `started`, the job's run, only without stream flags)."""
        if self.flags is not None:
            self.flags.wait(self.done, 1)
            self.flags.write(self.done, 0)
        elif started is not None:
            start = time.perf_counter()
            started.exception()  # waits; a failure is raised once, here, not again by the next call
            self.wait_ms += (time.perf_counter() - start) * 1e3
            self._raise_worker_error()
        out += job.staging.result.to(out.device, non_blocking=True)

    def _staging_for(self, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor, plan: RoutePlan) -> _Staging:
        key = (tuple(x.shape), tuple(ids.shape), tuple(plan.status.shape), x.dtype, ids.dtype, weights.dtype)
        staging = self._staging.get(key)
        if staging is None:
            def pinned(like: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
                return torch.empty(like.shape, dtype=dtype or like.dtype, device="cpu", pin_memory=self.is_cuda)

            staging = self._staging[key] = _Staging(pinned(x), pinned(ids), pinned(weights), pinned(plan.status),
                                                    pinned(plan.inverse), pinned(x, torch.float32))
        return staging

    def _run(self, job: Job) -> None:
        try:
            with torch.inference_mode():  # a worker thread: no autograd; the inputs may be inference tensors
                if self.flags is not None:
                    if not self.ready.wait(1, WAIT_TIMEOUT_S):
                        raise TimeoutError(f"the device did not hand over a decode call's inputs in {WAIT_TIMEOUT_S} s")
                    self.ready.set(0)
                elif job.ready_event is not None:
                    job.ready_event.synchronize()
                start = time.perf_counter()
                self._compute_into(job.layer, job.staging)
                self._python_cpu_ms += (time.perf_counter() - start) * 1e3
        except BaseException as e:
            self._error = e
            raise
        finally:
            self.done.set(1)  # always: a device stream may be waiting for it

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
        if error is None and self._native is not None and (native := self._native.take_error()) is not None:
            error = RuntimeError(native)
        if error is not None:
            raise RuntimeError("the CPU expert worker failed") from error

    @property
    def cpu_ms(self) -> float:
        """The CPU kernel's time on the workers since the last `reset_counters`."""
        native = self._native.busy_ms - self._native_busy_base if self._native is not None else 0.0
        return self._python_cpu_ms + native

    def reset_counters(self) -> None:
        self._python_cpu_ms = self.wait_ms = 0.0
        self._native_busy_base = self._native.busy_ms if self._native is not None else 0.0

    def drain(self) -> None:
        """Wait for the queued CPU work (and raise its error)."""
        if self._last is not None:
            self._last.exception()  # waits; the error itself is raised below
        self._drain_native()
        self._raise_worker_error()

    def close(self) -> None:
        """Stop the worker and free the staging buffers now. They are pinned blocks that captured
        copies used: freed while some later capture is running (the garbage collector reaching a
        closed executor), torch's pinned allocator records their release into that capture, and
        its next pinned allocation fails ("CUDA error: invalid argument", in ft bench on the H200)."""
        self._pool.shutdown(wait=True)
        if self._native is not None:
            self._native.close()
        self._staging.clear()
