"""The sessions of one loaded model: a few conversations' states kept at once, so a short side
request (a coding agent's title, summary or subagent call, with its own system prompt) does not
throw away the main conversation's state, and the next main turn continues where it was.

A request goes to the session that keeps the most of its prompt (Session.reusable: the longest
common prefix it can keep) where it continues that session's last prompt (the reply sent back
re-rendered, at most). Where it departs inside that prompt (another conversation sharing a system
prompt and tools: a subagent, a second agent; or an edited history) and a session is spare (empty,
or one more while the pool has room), the spare one starts with the shared prefix copied
(Session.take_prefix) and the other keeps its state. Where none is spare, or the model's caches
cannot be copied so (recurrent layers), the request takes the session keeping the most if that
throws away at most half of what it holds, else an empty one, else the one used least recently.
Sessions are made on first use, each with the whole context's state.

Where the pool has a parking budget (a model on the GPU keeps one session, in VRAM), a
conversation about to lose its state to another is first copied to host memory (Session.park),
and a request that keeps more of a parked conversation than any session does gets it copied back
(Session.unpark): host RAM is the second tier of the conversations' states, the oldest parked
going first when the budget is full. A parked conversation leaves the host only for a request that
continues all of it; one that shares a prefix of it (a subagent with the main conversation's
system prompt) starts from a copy and leaves it parked.

Generations run concurrently, one a session: a session is taken (`choose`) until its generation
gives it back (`give_back`), and only free ones are chosen. The pool is shared by the model's
worker threads, so its bookkeeping takes a lock.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable

from ..engine import ParkedConversation, Session
from ..models.state_copy import host_bytes

MIN_SHARED_TOKENS = 64  # a shared prefix shorter than this is computed again, not copied


class SessionPool:
    """Up to `size` sessions over one model, all of `context_length` tokens (`make(context)`)."""

    def __init__(self, make: Callable[[int], Session], context_length: int, size: int = 1, park_bytes: int = 0) -> None:
        if size < 1:
            raise ValueError(f"a session pool holds at least one session, not {size}")
        self.make, self.size, self.context_length = make, size, context_length
        self.park_bytes = park_bytes  # host memory for parked conversations (0: none parked)
        self.parked: list[ParkedConversation] = []  # oldest first
        self.sessions: list[Session] = [make(context_length)]
        self._used: dict[int, int] = {id(self.sessions[0]): 0}
        self._taken: set[int] = set()  # ids of the sessions generations run in now
        self._copies: bool | None = None  # whether the model's states take a prefix copied (known after a try)
        self._clock = itertools.count(1)
        self._lock = threading.Lock()

    def choose(self, prompt: list[int], context_length: int) -> Session:
        """A free session for `prompt`, taken until `give_back` (a context other than the pool's: the
        free sessions are dropped and the pool starts over). The caller runs at most `size`
        generations at once, so one is free."""
        with self._lock:
            if context_length != self.context_length:
                self.sessions = [s for s in self.sessions if id(s) in self._taken]  # (gone when given back)
                self.context_length, self.parked = context_length, []
            session = self._pick(prompt)
            self._used[id(session)] = next(self._clock)
            self._taken.add(id(session))
            return session

    def give_back(self, session: Session) -> None:
        """`session`'s generation is over: the session may be chosen again (one of an older context
        leaves the pool)."""
        with self._lock:
            self._taken.discard(id(session))
            if session.context_length != self.context_length and session in self.sessions:
                self.sessions.remove(session)
                self._used.pop(id(session), None)

    def _pick(self, prompt: list[int]) -> Session:
        free = [s for s in self.sessions if id(s) not in self._taken and s.context_length == self.context_length]
        if not free:
            return self._new()
        kept = {id(s): s.reusable(prompt) for s in free}
        best = max(free, key=lambda s: (kept[id(s)], self._used[id(s)]))
        if best.tokens and kept[id(best)] >= min(len(best.tokens), getattr(best, "prompt_length", len(best.tokens))):
            return best  # it continues the session's last prompt (its reply sent back re-rendered, at most)
        # it departs inside that prompt: another conversation sharing a prefix, or an edited history;
        # where a session is spare, it starts with the prefix copied and `best` keeps its own
        spare = next((s for s in free if not s.tokens), None)
        if spare is None and len(self.sessions) < self.size and self._copies is not False:
            spare = self._new()
        if spare is not None and kept[id(best)] >= MIN_SHARED_TOKENS and self._copies is not False:
            self._copies = spare.take_prefix(best, kept[id(best)])
            if self._copies:
                return spare
        if 2 * kept[id(best)] >= len(best.tokens):  # it keeps at least half of what it holds
            target = best
        else:
            target = spare or (self._new() if len(self.sessions) < self.size else
                               min(free, key=lambda s: self._used[id(s)]))
        return self._with_parked(target, prompt)

    def _with_parked(self, target: Session, prompt: list[int]) -> Session:
        """`target`, its conversation parked first if it is about to lose tokens, holding the
        parked conversation that keeps more of `prompt` than it does, if one does."""
        keep = target.reusable(prompt)
        if keep < len(target.tokens):
            self._park(target)
        back = max(self.parked, key=lambda c: c.reusable(prompt), default=None)
        reused = back.reusable(prompt) if back is not None else 0
        if reused > max(keep, MIN_SHARED_TOKENS - 1) and target.unpark(back) and reused == len(back.tokens):
            self.parked.remove(back)  # the prompt continues all of it: the session holds it now
        # (a prompt that keeps only a prefix of it, a subagent sharing the main conversation's system
        # prompt, leaves it parked: the session is about to drop the rest, which its own next turn needs)
        return target

    def _park(self, session: Session) -> None:
        if self.park_bytes <= 0 or len(session.tokens) < MIN_SHARED_TOKENS:
            return
        conversation = session.park()  # (sharing the rows of its earlier parking, or of the one it came from)
        if conversation is None or conversation.state.nbytes > self.park_bytes:
            session.parked_copy = None
            return
        tokens = conversation.tokens  # (an older parking of the same conversation is superseded)
        self.parked = [c for c in self.parked if c.tokens != tokens[: len(c.tokens)]] + [conversation]
        while self.parked_bytes > self.park_bytes and self.parked:
            self.parked.pop(0)
        for other in self.sessions:  # then the host copies sessions keep of what they hold
            if self.parked_bytes <= self.park_bytes:
                break
            other.parked_copy = None

    @property
    def parked_bytes(self) -> int:
        """Host memory of the parked conversations and of the sessions' copies of theirs, rows
        shared between them counted once."""
        copies = [s.parked_copy.state for s in self.sessions if getattr(s, "parked_copy", None) is not None]
        return host_bytes([c.state for c in self.parked] + copies)

    def _new(self) -> Session:
        session = self.make(self.context_length)
        self.sessions.append(session)
        self._used[id(session)] = 0
        return session
