"""Queueing pieces of the model manager: admission to the bounded queue, keep-alive durations, the
hand-off of one generation between the event loop and a model's worker thread, and the turns
concurrent generations of one model take.

Policy only; no model code. A generation is a `Job`: a worker thread runs it and pushes events
into an asyncio queue through `loop.call_soon_threadsafe`; the request's coroutine reads them.
Cancelling a job (client gone) sets an event the model checks before every forward pass, so the
worker stops at the next token and the model's slot frees. A model that keeps several sessions
runs as many generations at once, each on its own worker thread and session, their forward
passes taking turns first come, first served (`Turnstile`): one decode step, or one slice of a
prompt, each. A model that keeps one session whose state can be parked (a GPU model's) has its
generations take turns at that state (time_share.py: `CancellableModel.share`).
"""

from __future__ import annotations

import asyncio
import logging
import math
import re
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any, Protocol

from .protocol import Busy

log = logging.getLogger(__name__)

DEFAULT_KEEP_ALIVE_S = 300.0  # Ollama's 5 minutes
DEFAULT_MAX_QUEUE = 16
MAX_KEEP_ALIVE_S = 10 * 365 * 86400.0  # longer reads as forever (and keeps timestamps in range)

_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")
_UNIT_SECONDS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_keep_alive(value: Any) -> float:
    """Seconds from Ollama's keep_alive: a number of seconds, or a Go duration ("5m", "1h30m",
    "-1", "0"). Negative means forever. ValueError with the accepted forms otherwise."""
    if isinstance(value, bool):
        raise ValueError(f"invalid keep_alive {value!r}: give seconds (300) or a duration (\"5m\", \"1h\", \"-1\")")
    if isinstance(value, (int, float)):
        if not math.isfinite(value):
            raise ValueError(f"invalid keep_alive {value!r}: must be finite")
        return float(value)
    if not isinstance(value, str):
        raise ValueError(f"invalid keep_alive {value!r}: give seconds (300) or a duration (\"5m\", \"1h\", \"-1\")")
    text = value.strip()
    sign = -1.0 if text.startswith("-") else 1.0
    body = text[1:] if text[:1] in "+-" else text
    if re.fullmatch(r"\d+(?:\.\d*)?|\.\d+", body):
        seconds = float(body)  # "300", "-1": seconds
    else:
        parts = _DURATION_PART.findall(body)
        if not body or "".join(n + u for n, u in parts) != body:
            raise ValueError(f"invalid keep_alive {value!r}: give seconds (300) or a duration (\"5m\", \"1h30m\", \"-1\")")
        seconds = sum(float(n) * _UNIT_SECONDS[u] for n, u in parts)
    if not math.isfinite(seconds):
        raise ValueError(f"invalid keep_alive {value!r}: must be finite")
    return sign * seconds


class GenerationCancelled(Exception):
    """Raised inside the worker when the client that asked for a generation is gone."""


class Admission:
    """Counts requests waiting for a model (loading or queued behind a running generation).

    At most `max_queue` wait at once, over all models; one more gets Busy. A request waits from
    its arrival (its model may be loading) until its generation starts, or it ends without one.
    """

    def __init__(self, max_queue: int) -> None:
        if max_queue < 1:  # the request about to run waits too, while its model loads
            raise ValueError(f"max_queue must be >= 1, not {max_queue}")
        self.max_queue = max_queue
        self.waiting = 0
        self._lock = threading.Lock()

    def admit(self) -> Ticket:
        with self._lock:
            if self.waiting >= self.max_queue:
                raise Busy(f"server busy: {self.waiting} requests are already queued (FT_MAX_QUEUE={self.max_queue}); "
                           "retry later")
            self.waiting += 1
        return Ticket(self)

    def _leave(self) -> None:
        with self._lock:
            self.waiting -= 1


class Ticket:
    """One admitted request's place in the queue; `release` is idempotent and thread-safe."""

    def __init__(self, admission: Admission) -> None:
        self._admission = admission
        self._released = False
        self._lock = threading.Lock()

    def release(self) -> None:
        with self._lock:
            if self._released:
                return
            self._released = True
        self._admission._leave()


class Job:
    """One generation handed to a worker thread: its inputs, a cancel flag, and the way back.

    `emit` is called on the worker thread; items (events, or a ServerError to raise) arrive in
    `queue` on the loop. Once the loop is gone, emitting cancels the job.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, ticket: Ticket, **inputs: Any) -> None:
        self.loop = loop
        self.ticket = ticket
        self.inputs = inputs
        self.cancelled = threading.Event()
        self.queue: asyncio.Queue[Any] = asyncio.Queue()

    def emit(self, item: Any) -> None:
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, item)
        except RuntimeError:  # the event loop is closed: nobody is listening any more
            self.cancelled.set()

    def cancel(self) -> None:
        self.cancelled.set()


class Turnstile:
    """A fair lock: threads get it in the order they asked (a ticket lock). A plain lock may hand
    itself straight back to the thread that released it, so one generation's steps could starve
    another's."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._next = 0  # the next ticket to give out
        self._serving = 0  # the ticket whose turn it is

    @contextmanager
    def turn(self) -> Iterator[None]:
        self.acquire()
        try:
            yield
        finally:
            self.release()

    def acquire(self) -> None:
        """Wait for the calling thread's turn, behind every thread that asked before it."""
        with self._cond:
            ticket, self._next = self._next, self._next + 1
            self._cond.wait_for(lambda: self._serving == ticket)

    def release(self) -> None:
        """The turn goes to the thread that asked next."""
        with self._cond:
            self._serving += 1
            self._cond.notify_all()

    @property
    def waiting(self) -> int:
        """Threads waiting for their turn (not the one holding it)."""
        with self._cond:
            return max(0, self._next - self._serving - 1)


class SharedState(Protocol):
    """What a model wrapper asks of the turns at one session's state (time_share.TimeShare), so
    that this module, which time_share builds on, does not import it."""

    @property
    def contended(self) -> bool: ...  # another generation waits for the state

    def boundary(self, num_tokens: int, may_switch: bool = True) -> None: ...  # before the holder's pass


class StepBatcher(Protocol):
    """What a model wrapper asks of the batching of concurrent generations' decode steps
    (batching.DecodeBatcher), so that this module, which batching builds on, does not import it."""

    def step(self, model: Any, input_ids: Any, state: Any, job: Job | None,
             turn: Callable[[], AbstractContextManager[None]], call: Callable[[Callable[[], Any]], Any]) -> Any: ...


class CancellableModel:
    """A model wrapper that refuses the next forward pass once the job its thread runs is
    cancelled, and makes concurrent generations' forward passes take turns (`Turnstile`); their
    one-token passes run in batches where a `batcher` is given (batching.py).

    The session keeps `tokens` in step with the state only between passes, so after a refusal
    the caller trims `session.tokens` to `session.state.length` (what the state really holds).
    """

    def __init__(self, model: Any, queue_ahead: bool = False, share: SharedState | None = None,
                 batcher: StepBatcher | None = None, passes: ThreadPoolExecutor | None = None) -> None:
        """`queue_ahead`: one generation runs at a time (one session), so its decode steps may be
        queued ahead where the model can (`can_queue`). `share`: the generations take turns at one
        session's state (time_share.py): each holds it for its run, handing it over at a turn
        boundary, so a pass takes no turn of its own (the turnstile is unused). `batcher`: the
        one-token passes of generations in sessions of their own go through it (not with `share`).
        `passes`: one thread every forward pass runs on, whichever generation's turn it is
        (batching.pass_thread: a CPU model's); the wrapper ends it at `close`."""
        self.model = model
        self.queue_ahead = queue_ahead
        self.share = share
        self.batcher = batcher if share is None else None
        self._thread = passes
        self.turnstile = Turnstile()
        self._unread = 0  # a time-shared state's holder: steps queued whose logits are not read yet
        self._jobs: dict[int, Job] = {}  # worker thread -> the job it runs

    def running(self, job: Job | None) -> None:
        """The calling worker thread runs `job` now (None: nothing)."""
        if job is None:
            self._jobs.pop(threading.get_ident(), None)
        else:
            self._jobs[threading.get_ident()] = job

    @property
    def jobs(self) -> list[Job]:
        """The jobs running now."""
        return list(self._jobs.values())

    def new_state(self, max_tokens: int) -> Any:
        return self.model.new_state(max_tokens)

    def reset_state(self, state: Any) -> Any:
        return self.model.reset_state(state)

    @property
    def rewinds(self) -> bool:
        return getattr(self.model, "rewinds", False)

    def set_length(self, state: Any, length: int) -> None:  # (a session takes its state back to a prefix)
        self.model.set_length(state, length)

    def checkpoint(self, state: Any) -> Any:  # (a recurrent model's session saves its state, to take it back)
        take = getattr(self.model, "checkpoint", None)
        return take(state) if take is not None else None

    def restore(self, state: Any, saved: Any) -> None:
        self.model.restore(state, saved)

    def copy_prefix(self, source: Any, target: Any, length: int, saved: Any = None) -> bool:  # (Session.take_prefix)
        copy = getattr(self.model, "copy_prefix", None)
        if copy is None:
            return False
        with self._exclusive():
            return copy(source, target, length, saved)

    def park_parts(self, state: Any, spans: list[tuple[int, int]], saved: Any = None) -> Any:  # (Session.park_into)
        park = getattr(self.model, "park_parts", None)
        if park is None:
            return None
        with self._exclusive():
            return park(state, spans, saved)

    @property
    def can_park(self) -> bool:
        """Whether the model's states can go to host memory and back at all (Session.park_held)."""
        return all(getattr(self.model, name, None) is not None for name in ("park_parts", "unpark"))

    def unpark(self, parked: Any, state: Any) -> bool:  # (Session.unpark_blocks)
        unpark = getattr(self.model, "unpark", None)
        if unpark is None:
            return False
        with self._exclusive():
            return unpark(parked, state)

    def forward(self, input_ids: Any, state: Any, last_only: bool = False) -> Any:
        if self.batcher is not None and int(input_ids.numel()) == 1 and hasattr(self.model, "decode_batch"):
            job = self._jobs.get(threading.get_ident())  # (one token: [1, V], last_only or not)
            return self.batcher.step(self.model, input_ids, state, job, lambda: self._turn(1), self._call)
        with self._turn(int(input_ids.numel())):
            return self._call(lambda: self.model.forward(input_ids, state, last_only))

    def _call(self, pass_: Callable[[], Any]) -> Any:
        """`pass_()` on the passes' thread where there is one, else here."""
        return pass_() if self._thread is None else self._thread.submit(pass_).result()

    def close(self) -> None:
        """The passes' thread, where there is one, ends (after the pass it runs)."""
        if self._thread is not None:
            self._thread.shutdown(wait=False)

    @property
    def can_queue(self) -> bool:
        """Whether a generation may queue each decode step before its token is known, as `ft run`
        does on the GPU (DeviceModel.queue_decode: the step's launches made while the one before
        runs): the model can, and only one generation runs at a time. A queued step holds the
        device's stream until its token comes, so another generation's turn, queued behind it,
        would wait for ever."""
        return self.queue_ahead and bool(getattr(self.model, "can_queue", False))

    def queue_decode(self, state: Any) -> Any:
        """The model's queued step (`can_queue`); a cancelled job stops here, as at `forward`
        (the step before it was started: the state counts its token, as Session's tokens do).
        A time-shared state is handed over here only where no step queued before is unread (its
        logits come back in buffers the next holder's steps would write)."""
        with self._turn(1, may_switch=self._unread == 0):
            step = self.model.queue_decode(state)
        if self.share is None:
            return step
        self._unread += 1
        return _Tracked(step, self)

    @property
    def contended(self) -> bool:
        """Whether another generation waits for the state this one holds (time-shared): its next
        decode step is not queued ahead, so that it may hand the state over before it."""
        return self.share is not None and self.share.contended

    def _exclusive(self) -> Any:
        """A turn for a copy between states and host memory: the caller's own where the state is
        time-shared (it holds it)."""
        return nullcontext() if self.share is not None else self.turnstile.turn()

    @contextmanager
    def _turn(self, num_tokens: int, may_switch: bool = True) -> Iterator[None]:
        """The calling generation's turn at the model for a pass of `num_tokens` tokens;
        GenerationCancelled where its job was cancelled (while it waited for the turn too)."""
        job = self._jobs.get(threading.get_ident())
        if self.share is not None:  # it holds the state: a boundary where it may hand it over
            if job is not None and job.cancelled.is_set():
                raise GenerationCancelled
            self.share.boundary(num_tokens, may_switch)
            yield
            return
        with self.turnstile.turn():
            if job is not None and job.cancelled.is_set():
                raise GenerationCancelled
            yield


class _Tracked:
    """A queued decode step of a time-shared state's holder, counted unread until its logits are
    read or it is cancelled (CancellableModel.queue_decode)."""

    def __init__(self, step: Any, owner: CancellableModel) -> None:
        self._step, self._owner, self._unread = step, owner, True

    def start(self, token: int, needed: int | None = None) -> None:
        self._step.start(token, needed)

    def logits(self) -> Any:
        try:
            return self._step.logits()
        finally:
            self._read()

    def cancel(self) -> None:
        try:
            self._step.cancel()
        finally:
            self._read()

    def _read(self) -> None:
        if self._unread:
            self._unread = False
            self._owner._unread -= 1
