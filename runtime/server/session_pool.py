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
conversation about to lose its state to another is first stored in host memory, in blocks of
tokens found by prefix (models/prefix_blocks.py: only the blocks not stored yet are copied off the
device, so a system prompt many conversations share is stored once), and a request that finds a
longer prefix of its prompt there than any session keeps gets those blocks copied back
(Session.unpark_blocks), whichever conversation stored them: host RAM is the second tier of the
conversations' states, its least recently used blocks going first when the budget is full. Blocks
stay stored when copied back: a subagent starting from the main conversation's system prompt
takes a copy, and the main conversation's next turn still finds its whole history.

Generations run concurrently, one a session: a session is taken (`choose`) until its generation
gives it back (`give_back`), and only free ones are chosen. The pool is shared by the model's
worker threads, so its bookkeeping takes a lock.

A pool of one session with a parking budget is time-shared (`time_shared`; server/time_share.py
decides when to switch): its generations take turns at the one state, each holding it for its run
but where it hands it over at a turn boundary. Then the one session is the conversation the state
holds now; one handing the state over is stored in the block store (`suspend`) and copied back
when its turn comes (`resume`); a request that comes while the session's generation is suspended
takes the state over (Session.sharing: what it holds is its to keep, and the longest stored prefix
of its prompt as any request's). Every call of a time-shared pool comes from the generation
holding the state.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable

from ..engine import Session
from ..models.prefix_blocks import BlockStore

MIN_SHARED_TOKENS = 64  # a shared prefix shorter than this is computed again, not copied


class SessionPool:
    """Up to `size` sessions over one model, all of `context_length` tokens (`make(context)`)."""

    def __init__(self, make: Callable[[int], Session], context_length: int, size: int = 1, park_bytes: int = 0) -> None:
        if size < 1:
            raise ValueError(f"a session pool holds at least one session, not {size}")
        self.make, self.size, self.context_length = make, size, context_length
        self.park_bytes = park_bytes  # host memory for parked conversations' blocks (0: none parked)
        self.parked = BlockStore()
        self.sessions: list[Session] = [make(context_length)]
        self._used: dict[int, int] = {id(self.sessions[0]): 0}
        self._taken: set[int] = set()  # ids of the sessions generations run in now
        self._copies: bool | None = None  # whether the model's states take a prefix copied (known after a try)
        self._suspended: dict[int, int] = {}  # a time-shared pool's: id of a session whose state is stored -> its length
        self._clock = itertools.count(1)
        self._lock = threading.Lock()

    def choose(self, prompt: list[int], context_length: int) -> Session:
        """A free session for `prompt`, taken until `give_back` (a context other than the pool's: the
        free sessions are dropped and the pool starts over). The caller runs at most `size`
        generations at once, so one is free."""
        with self._lock:
            if context_length != self.context_length and not (self.time_shared and self._taken):
                self.sessions = [s for s in self.sessions if id(s) in self._taken]  # (gone when given back)
                self.context_length = context_length
                self.parked.clear()
            if self.time_shared and self.sessions and id(self.sessions[0]) in self._taken:
                session = self._take_over(prompt, context_length)  # its generation handed the state over
            else:
                session = self._pick(prompt)
            self._used[id(session)] = next(self._clock)
            self._taken.add(id(session))
            return session

    def give_back(self, session: Session) -> None:
        """`session`'s generation is over: the session may be chosen again (one of an older context
        leaves the pool)."""
        with self._lock:
            self._taken.discard(id(session))
            self._suspended.pop(id(session), None)  # (cancelled while suspended: its blocks stay stored)
            if session not in self.sessions:  # a time-shared pool's, whose state another took over
                self._used.pop(id(session), None)
            elif session.context_length != self.context_length:
                self.sessions.remove(session)
                self._used.pop(id(session), None)

    @property
    def time_shared(self) -> bool:
        """Whether generations take turns at one session's state (one session, a parking budget: a
        model on the GPU), rather than running one after another."""
        return self.size == 1 and self.park_bytes > 0

    def suspend(self, session: Session) -> bool:
        """At a turn boundary of `session`'s generation (it holds the state): what its state holds
        stored (only the blocks not stored yet copied off the device), so another generation may
        take the state over. False, nothing changed, where it cannot be (the model's state cannot
        be parked, or a recurrent one saved, at this point): it keeps the state to its end."""
        with self._lock:
            length = session.park_held(self.parked)
            if length is None:
                return False
            self._suspended[id(session)] = length
            self.parked.evict(self.park_bytes)  # (its own blocks, the latest used, go last)
            return True

    def resume(self, session: Session) -> None:
        """`session`'s turn is back: the state holding what it held when suspended (its stored
        blocks copied back; any evicted since computed again), the conversation there before stored
        first where it had finished (for its next turn; a suspended one stored itself)."""
        with self._lock:
            length = self._suspended.pop(id(session))
            held = self.sessions[0]
            if held is session and session.state.length == length:
                return  # nobody used the state meanwhile (the waiter's client had gone)
            if held is not session and id(held) not in self._suspended:
                self._park(held)
            session.state = held.state
            self.sessions = [session]
            session.restore_held(self.parked, length)

    def _take_over(self, prompt: list[int], context_length: int) -> Session:
        """A time-shared pool's session for a request that comes while the state's generation is
        suspended (stored): a new session over the state (no new one allocated), keeping what the
        state holds that `prompt` shares, or the longest prefix stored, as `_with_parked` does.
        A context other than the pool's runs within the state's."""
        session = self.sessions[0].sharing(context_length)
        self.sessions = [session]
        return self._with_parked(session, prompt)

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
        longest stored prefix of `prompt` if that keeps more of it than `target` does."""
        keep = target.reusable(prompt)
        if keep < len(target.tokens):
            self._park(target)
        if self.park_bytes <= 0:
            return target
        found = self.parked.lookup(prompt, getattr(target.model, "rewinds", False))
        if found is not None and found.length > max(keep, MIN_SHARED_TOKENS - 1) and target.unpark_blocks(found):
            self.parked.hit(found)
        return target

    def _park(self, session: Session) -> None:
        if self.park_bytes <= 0 or len(session.tokens) < MIN_SHARED_TOKENS:
            return
        session.park_into(self.parked)
        self.parked.evict(self.park_bytes)

    @property
    def parked_bytes(self) -> int:
        """Host memory of the parked blocks."""
        return self.parked.nbytes

    def _new(self) -> Session:
        session = self.make(self.context_length)
        self.sessions.append(session)
        self._used[id(session)] = 0
        return session
