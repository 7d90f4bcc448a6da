"""Concurrent generations' decode steps as one batched pass (issue 23: a coding agent's main
conversation and its subagents or side requests decoding at once).

A model that keeps several sessions (a CPU model: session_pool.py) runs a generation a session,
each on its own worker thread, their forward passes taking turns (scheduler.Turnstile). A decode
step reads the dense weights, every chosen expert and the LM head for one token; several
generations' steps taken together read the dense weights and the head once and each expert once
for the rows that chose it (DecoderModel.decode_batch). Measured on the race's Q4_K_M file (8 of
Qwen3-30B-A3B's layers, 2 threads of the dev VM, random ids: each token its own experts;
benchmarks/bench_decode_batch.py), a step of 2, 3 and 4 tokens costs 1.30x, 1.82x and 2.34x one
token's: two streams together get ~1.5x the tokens a second of one.

How a step joins a batch: it is added to the pending steps, then its generation takes its turn at
the model as any pass does (first come, first served, prompt slices included). At its turn, a step
another generation's turn has run meanwhile returns at once; otherwise it runs the pending steps,
up to MAX_BATCH, as one pass and hands each its logits. Each generation samples its token on its
own thread between passes, so two generations stepping in turns would each find the other's next
step not yet pending and never meet: a turn first waits, up to half a pass (GATHER_SHARE of the
last pass, at most GATHER_MAX_S), for the steps of the generations served in the last two passes'
time that are not pending yet. Once two steps run in one pass both come back together and stay
in step. A generation alone waits for no one and runs its step as before (`forward`). A step whose
job was cancelled is dropped from a batch (its state not moved, as a refused pass leaves it). A
batch refused for a full context is run a step at a time, so each step gets its own answer or
its own error.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from typing import Any

import torch

from ..models import ContextOverflowError
from .scheduler import GenerationCancelled, Job

# Steps a pass at most: the CPU kernel's dense products take up to 4 tokens a pass over a weight
# (runtime/experts/cpu_kernels.DENSE_MAX_TOKENS); more would read the weights again.
MAX_BATCH = 4
GATHER_SHARE = 0.5  # of the last pass's time, a turn's wait for the steps of generations served lately
GATHER_MAX_S = 0.05


def pass_thread() -> ThreadPoolExecutor:
    """One thread for every forward pass of a model whose generations run on threads of their own
    (CancellableModel's `passes`), with the calling thread's torch thread count (each thread's
    own setting). OpenMP keeps a team of threads for each thread that opens a parallel region, and
    the idle teams of the other generations' threads spin on the cores the running one needs: on
    the 2-core VM a worker thread's decode ran at 0.6-0.8x the main thread's with the default wait
    policy (1x with OMP_WAIT_POLICY=passive)."""
    return ThreadPoolExecutor(1, thread_name_prefix="ft-passes", initializer=torch.set_num_threads,
                              initargs=(torch.get_num_threads(),))


class _Step:
    """One generation's one-token pass, waiting to be run (by its own turn or another's)."""

    def __init__(self, input_ids: torch.Tensor, state: Any, job: Job | None) -> None:
        self.input_ids, self.state, self.job = input_ids, state, job
        self.logits: torch.Tensor | None = None
        self.error: BaseException | None = None

    @property
    def done(self) -> bool:
        return self.logits is not None or self.error is not None

    def result(self) -> torch.Tensor:
        if self.error is not None:
            raise self.error
        assert self.logits is not None
        return self.logits


class DecodeBatcher:
    """Batches the one-token passes concurrent generations make of a model (`step`)."""

    def __init__(self, max_batch: int = MAX_BATCH) -> None:
        self.max_batch = max_batch
        self._pending: list[_Step] = []
        self._lock = threading.Condition()
        self._served: dict[int, float] = {}  # id of a state -> when a pass last ran its step
        self._pass_s = 0.0  # the last pass's time
        self.passes = 0  # batched passes run (of two steps or more): a diagnostic
        self.batched_steps = 0  # steps run in them

    def step(self, model: Any, input_ids: torch.Tensor, state: Any, job: Job | None,
             turn: Callable[[], AbstractContextManager[None]],
             call: Callable[[Callable[[], Any]], Any] = lambda pass_: pass_()) -> torch.Tensor:
        """Logits [1, V] of `input_ids` (one token) following `state`'s tokens, run in a batch with
        the other generations' pending steps (by `model.decode_batch`, or `model.forward` alone).
        `turn()`: the calling generation's turn at the model (GenerationCancelled where its job was
        cancelled: the step is withdrawn where not run); `call(pass_)`: where the pass runs (the
        model wrapper's passes' thread: `pass_thread`)."""
        mine = _Step(input_ids, state, job)
        with self._lock:
            self._pending.append(mine)
            self._lock.notify_all()
        try:
            with turn():
                if not mine.done:
                    with self._lock:
                        self._lock.wait_for(self._gathered, timeout=min(GATHER_MAX_S, GATHER_SHARE * self._pass_s))
                        others = [s for s in self._pending if s is not mine][: self.max_batch - 1]
                        batch = [mine, *others]
                        for s in batch:
                            self._pending.remove(s)
                    start = time.perf_counter()
                    call(lambda: self._run(model, batch))
                    with self._lock:
                        self._pass_s = time.perf_counter() - start
                        for s in batch:
                            self._served[id(s.state)] = time.perf_counter()
        except GenerationCancelled:
            with self._lock:
                if mine in self._pending:
                    self._pending.remove(mine)
            raise
        return mine.result()

    def _gathered(self) -> bool:
        """Whether the pass may start (under the lock): a full batch pending, or every generation
        served within the last two passes' time has its step pending (those served longer ago are
        forgotten: a generation that ended comes back no more)."""
        if len(self._pending) >= self.max_batch:
            return True
        now, recent = time.perf_counter(), 2 * self._pass_s
        self._served = {k: t for k, t in self._served.items() if now - t <= recent}
        return set(self._served) <= {id(s.state) for s in self._pending}

    def _run(self, model: Any, batch: list[_Step]) -> None:
        live = []
        for s in batch:
            if s.job is not None and s.job.cancelled.is_set():
                s.error = GenerationCancelled()
            else:
                live.append(s)
        if len(live) > 1:
            try:
                logits = model.decode_batch(torch.cat([s.input_ids.reshape(1) for s in live]),
                                            [s.state for s in live])
            except ContextOverflowError:  # (refused before any state moved) each on its own below
                pass
            except Exception as e:  # noqa: BLE001 - every step of the pass gets the pass's error
                for s in live:
                    s.error = e
                return
            else:
                self.passes += 1
                self.batched_steps += len(live)
                for i, s in enumerate(live):
                    s.logits = logits[i:i + 1]
                return
        for s in live:
            try:
                s.logits = model.forward(s.input_ids, s.state)
            except Exception as e:  # noqa: BLE001 - the step's own error, raised in its generation
                s.error = e
