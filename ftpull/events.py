"""Pull progress as data: what the CLI draws as bars and the server will stream as NDJSON."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class PullEvent:
    """Shaped like Ollama's /api/pull stream: a status line and optional byte counts."""

    status: str
    total: int | None = None
    completed: int | None = None


Report = Callable[[PullEvent], None]
UP_TO_DATE = " is up to date"


def up_to_date(name: str) -> PullEvent:
    """What a pull of `name` says when the model is stored and whole: nothing was done."""
    return PullEvent(f"{name}{UP_TO_DATE}")


def is_up_to_date(event: PullEvent) -> bool:
    """Whether `event` is `up_to_date`'s (from this process or a server's /api/pull stream): `ft
    run` does not print it, as `ollama run` says nothing of a model it has."""
    return event.total is None and event.status.endswith(UP_TO_DATE)


def quiet(event: PullEvent) -> None:
    """A Report that drops everything."""


class ByteCounter:
    """Turns byte counts (download, conversion) into PullEvents, at most one per 0.1%."""

    def __init__(self, report: Report, status: str, total: int) -> None:
        self.report, self.status, self.total, self.done, self.last = report, status, total, 0, -1

    def __call__(self, n: int) -> None:
        """Count `n` more bytes."""
        self.at(self.done + n)

    def finish(self) -> None:
        """The work is done: the count reaches the total (an estimate may count bytes, such as a
        file's header, that the work never reports)."""
        self.at(max(self.done, self.total))

    def at(self, done: int) -> None:
        """Set the count to `done` bytes."""
        self.done = done
        step = self.done * 1000 // max(1, self.total)
        if step != self.last:
            self.last = step
            self.report(PullEvent(self.status, self.total, min(self.done, self.total)))
