"""The sessions of one loaded model: a few conversations' states kept at once, so a short side
request (a coding agent's title, summary or subagent call, with its own system prompt) does not
throw away the main conversation's state, and the next main turn continues where it was.

A request goes to the session that keeps the most of its prompt (Session.reusable: the longest
common prefix it can keep). Where that would throw away more than half of what the session holds
(another conversation's), it goes to an empty session while the pool has room, else to the one
used least recently. Sessions are made on first use, each with the whole context's state.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

from ..engine import Session


class SessionPool:
    """Up to `size` sessions over one model, all of `context_length` tokens (`make(context)`)."""

    def __init__(self, make: Callable[[int], Session], context_length: int, size: int = 1) -> None:
        if size < 1:
            raise ValueError(f"a session pool holds at least one session, not {size}")
        self.make, self.size, self.context_length = make, size, context_length
        self.sessions: list[Session] = [make(context_length)]
        self._used: dict[int, int] = {id(self.sessions[0]): 0}
        self._clock = itertools.count(1)

    def choose(self, prompt: list[int], context_length: int) -> Session:
        """The session `prompt` runs in (a context other than the pool's: the pool starts over)."""
        if context_length != self.context_length:
            self.sessions, self._used, self.context_length = [], {}, context_length
        session = self._pick(prompt)
        self._used[id(session)] = next(self._clock)
        return session

    def _pick(self, prompt: list[int]) -> Session:
        if not self.sessions:
            return self._new()
        kept = {id(s): s.reusable(prompt) for s in self.sessions}
        best = max(self.sessions, key=lambda s: (kept[id(s)], self._used[id(s)]))
        if 2 * kept[id(best)] >= len(best.tokens):  # it keeps at least half of what it holds
            return best
        empty = next((s for s in self.sessions if not s.tokens), None)
        if empty is not None:
            return empty
        if len(self.sessions) < self.size:
            return self._new()
        return min(self.sessions, key=lambda s: self._used[id(s)])

    def _new(self) -> Session:
        session = self.make(self.context_length)
        self.sessions.append(session)
        self._used[id(session)] = 0
        return session
