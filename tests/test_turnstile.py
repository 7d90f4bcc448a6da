"""Concurrent generations of one model take turns at its forward passes first come, first served
(runtime/server/scheduler.Turnstile): a thread that asks while another holds the turn gets it
before the holder can take it back, so no generation's steps starve another's."""

from __future__ import annotations

import threading
import time

from runtime.server.scheduler import Turnstile


def test_turns_go_in_the_order_they_were_asked() -> None:
    turnstile, order = Turnstile(), []
    holding, go = threading.Event(), threading.Event()

    def holder() -> None:
        with turnstile.turn():
            holding.set()
            go.wait(5)
            order.append("holder")

    def waiter(name: str, after: threading.Event, asked: threading.Event) -> None:
        after.wait(5)
        asked.set()
        with turnstile.turn():
            order.append(name)

    first_asked, second_asked = threading.Event(), threading.Event()
    threads = [threading.Thread(target=holder),
               threading.Thread(target=waiter, args=("first", holding, first_asked)),
               threading.Thread(target=waiter, args=("second", first_asked, second_asked))]
    for t in threads:
        t.start()
    second_asked.wait(5)
    time.sleep(0.05)  # both waiters queued behind the holder
    go.set()
    for t in threads:
        t.join(5)
    assert order == ["holder", "first", "second"]


def test_two_threads_taking_turns_alternate() -> None:
    """Each of two threads takes the turn again at once after its step: a plain lock can hand it
    straight back to the same thread; the turnstile gives it to the one that waited."""
    turnstile, steps = Turnstile(), []
    started = threading.Barrier(2)

    def generation(name: str) -> None:
        started.wait(5)
        for _ in range(20):
            with turnstile.turn():
                steps.append(name)
                time.sleep(0.001)

    threads = [threading.Thread(target=generation, args=(n,)) for n in "ab"]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert sorted(steps) == ["a"] * 20 + ["b"] * 20
    runs = sum(1 for x, y in zip(steps, steps[1:], strict=False) if x == y)  # a step right after its own
    assert runs <= 2, f"turns did not alternate: {''.join(steps)}"
