"""Rendering PullEvents on a terminal: one tqdm bar per phase, plain lines for status changes."""

from __future__ import annotations

import sys
from collections.abc import Callable

from tqdm.auto import tqdm

from .events import PullEvent


class ProgressPrinter:
    """A PullEvent sink for the CLI (stderr, so stdout stays clean for scripts)."""

    def __init__(self) -> None:
        self._bar: tqdm | None = None
        self._status: str | None = None

    def __enter__(self) -> ProgressPrinter:
        return self

    def __exit__(self, *exc: object) -> None:
        self._close_bar()

    def _close_bar(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def __call__(self, event: PullEvent) -> None:
        if event.total is None:
            self._close_bar()
            if event.status != "success":
                print(event.status, file=sys.stderr)
            self._status = event.status
            return
        if event.status != self._status or self._bar is None:
            self._close_bar()
            self._status = event.status
            self._bar = tqdm(total=event.total, desc=event.status, unit="B", unit_scale=True, unit_divisor=1024,
                             file=sys.stderr, leave=True, dynamic_ncols=True)
        delta = (event.completed or 0) - self._bar.n
        if delta:
            self._bar.update(delta)  # throttled by tqdm's mininterval

    def bytes_callback(self, status: str) -> Callable[[int, int], None]:
        """A `progress(done, total)` callback (as the registry's verify takes) feeding this printer."""

        def progress(done: int, total: int) -> None:
            self(PullEvent(status, total, done))

        return progress
