"""Generations taking turns at a model's only state (a GPU model's one session, its KV in VRAM), so
that a short request (a coding agent's title or summary call, a second agent's first turn) is not
queued behind the whole prefill and generation of a long one.

The state is a lease, a fair ticket lock (scheduler.Turnstile), that a generation holds from its
start to its end. At a turn boundary (before a forward pass: a prompt slice or a decode step) the
holder asks `SwitchPolicy` whether to hand it over; if so its conversation is parked in host memory
(SessionPool.suspend: only the blocks not stored yet copied off the device), it takes a ticket
behind the waiting generations, and when its turn comes back its conversation is copied back
(SessionPool.resume) and its pass runs. Nothing of a generation's tokens is lost or reordered: it
only pauses between two passes. When to switch is decided here; parking and restoring are the
session pool's and the engine's (Session.park_held / restore_held).

A model whose state cannot be parked (no park_parts, a recurrent state that cannot be saved at
that point) never hands it over: its requests run one after another, as without time sharing.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol

from .scheduler import GenerationCancelled, Job, Turnstile

EWMA_WEIGHT = 0.25  # the weight of the latest switch (decode step) in its running average


@dataclass(frozen=True)
class SwitchPolicy:
    """When the generation holding the state hands it to a waiting one. At a turn boundary, switch
    only where all of these hold:

    1. another generation waits: a lone generation never pays a copy (and keeps queueing its decode
       steps ahead on the GPU);
    2. the holder has run a quantum since it took the state: a prompt slice, or `decode_steps`
       decode steps; a waiter is paused at most that long per holder ahead of it;
    3. it has held the state at least `cost_factor` times what a switch costs (measured: the park
       and the restore), so switching takes at most about 1 / (1 + cost_factor) of the state's
       time however long the conversations grow (a 64k-token one's copies are larger);
    4. its remaining work (decode steps left before max_tokens, at the measured step time) is
       longer than a switch: where it would finish sooner, the waiter is answered sooner by
       waiting, and neither pays the copies. Unknown (no max_tokens, a prompt): longer.
    """

    decode_steps: int = 16
    cost_factor: float = 4.0

    def should_switch(self, *, waiting: int, slices: int, steps: int, held_s: float, switch_s: float,
                      remaining_s: float | None) -> bool:
        if waiting <= 0:
            return False
        if slices == 0 and steps < self.decode_steps:
            return False
        if held_s < self.cost_factor * switch_s:
            return False
        return remaining_s is None or remaining_s > switch_s


class Parking(Protocol):
    """The mechanism (server/session_pool.SessionPool): a generation's conversation parked at a
    turn boundary and restored when its turn comes back."""

    def suspend(self, session: Any) -> bool:
        """`session`'s state stored; False, nothing changed, where it cannot be (it keeps the state)."""
        ...

    def resume(self, session: Any) -> None:
        """`session`'s state back where `suspend` stored it."""
        ...


@dataclass
class _Holding:
    """The generation holding the state: its counts since it took the state last."""

    job: Job | None
    session: Any = None
    since: float = 0.0
    slices: int = 0
    steps: int = 0
    decoded: int = 0  # decode steps over the whole generation
    last_pass: float = 0.0  # when the pass before began
    last_was_step: bool = False
    switching: bool = False  # its state being restored (the restore's own passes never switch)
    parks: bool = True  # False once its state could not be parked: it runs to its end


class TimeShare:
    """The lease on a model's only state and the switches between the generations that share it."""

    def __init__(self, policy: SwitchPolicy | None = None) -> None:
        self.policy = policy or SwitchPolicy()
        self.lease = Turnstile()
        self.parking: Parking | None = None  # set once the session pool exists
        self.switch_s = 0.0  # a switch's cost (park + restore), averaged
        self.step_s = 0.0  # a decode step's time, averaged
        self.switches = 0
        self._holder: _Holding | None = None
        self._clock = time.perf_counter

    @property
    def contended(self) -> bool:
        """Whether a generation waits for the state."""
        return self.lease.waiting > 0

    @contextmanager
    def holding(self, job: Job | None) -> Iterator[None]:
        """The calling generation holds the state (a fair queue behind those that asked first) until
        the block ends, but where it hands it over at a turn boundary (`boundary`)."""
        self.lease.acquire()
        self._holder = _Holding(job, since=self._clock())
        try:
            yield
        finally:
            self._holder = None
            self.lease.release()

    def attach(self, session: Any) -> None:
        """The holder's session (chosen once it held the state), what `parking` stores and restores."""
        assert self._holder is not None
        self._holder.session = session

    def boundary(self, num_tokens: int, may_switch: bool = True) -> None:
        """Before the holder's forward pass of `num_tokens` tokens (1: a decode step): hand the state
        over if the policy says so (and `may_switch`: no queued step in flight), and back once its
        turn comes again. GenerationCancelled where its job was cancelled meanwhile. Outside
        `holding` (no time sharing yet): nothing."""
        h, now = self._holder, self._clock()
        if h is None or h.switching:
            return
        if h.last_was_step and h.last_pass:
            step = now - h.last_pass
            self.step_s = step if not self.step_s else (1 - EWMA_WEIGHT) * self.step_s + EWMA_WEIGHT * step
        if h.session is not None and h.parks and may_switch:
            max_tokens = getattr(h.job.inputs.get("params"), "max_tokens", None) if h.job is not None else None
            remaining = None
            if h.decoded and max_tokens and max_tokens > 0:
                remaining = max(0, max_tokens - h.decoded) * self.step_s
            if self.policy.should_switch(waiting=self.lease.waiting, slices=h.slices, steps=h.steps,
                                         held_s=now - h.since, switch_s=self.switch_s, remaining_s=remaining):
                self._switch(h)
                now = self._clock()
        h.slices += num_tokens > 1
        h.steps += num_tokens == 1
        h.decoded += num_tokens == 1
        h.last_pass, h.last_was_step = now, num_tokens == 1

    def _switch(self, h: _Holding) -> None:
        assert self.parking is not None
        start = self._clock()
        if not self.parking.suspend(h.session):
            h.parks = False  # today's one after another for this generation
            return
        parked_s = self._clock() - start
        self._holder = None
        self.lease.release()
        self.lease.acquire()  # behind every generation that waited
        self._holder = h
        h.since, h.slices, h.steps, h.last_pass = self._clock(), 0, 0, 0.0
        if h.job is not None and h.job.cancelled.is_set():
            raise GenerationCancelled  # (not restored: nobody listens)
        h.switching = True
        try:
            self.parking.resume(h.session)
        finally:
            h.switching = False
        cost = parked_s + self._clock() - h.since
        self.switch_s = cost if not self.switches else (1 - EWMA_WEIGHT) * self.switch_s + EWMA_WEIGHT * cost
        self.switches += 1
        h.since = self._clock()
