"""Generation: prefill a prompt, decode token by token, stream text, stop where asked.

A `Session` is one sequence: it owns the model's decode state and remembers which tokens the
state holds, so a chat turn whose prompt extends the previous one (the usual case: history +
new message) only prefills the new tokens.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from .models import ContextOverflowError, DecoderModel
from .models.base import StateCheckpoint
from .models.prefix_blocks import BlockStore, Found
from .models.state import DecodeState
from .models.state_copy import checkpoint_bytes
from .text.detokenize import IncrementalDetokenizer, StopStringMatcher
from .text.sampling import Sampler, SamplingParams
from .text.tokenizer import Tokenizer

OnText = Callable[[str], None]

# prompt tokens a continuing output is decoded after (as vLLM seeds its detokenizer): enough for
# the last word, whatever the tokenizer
CONTEXT_TOKENS = 6
# A model with recurrent layers keeps up to this many of its states saved, each where a prompt's
# last token begins (host copies: Qwen3-Next-sized Gated DeltaNet layers hold ~2 MiB each, ~70
# MiB a state): the next turn of a conversation departs there (a reply re-rendered by the
# template; a retried turn), and is taken back to it instead of recomputing the whole prompt.
# Past the count, the older ones are thinned to a ladder (`ladder`): a departure further back,
# where a template drops the thinking of every reply since the last user message (Qwen3's) or
# an agent edits an older tool call, recomputes about as much again as it lies back, not the
# whole conversation since the first message.
SAVED_STATES = 8
SAVED_STATES_BYTES = 512 << 20  # ... and within this many bytes (at least the last two)
# A long prompt fed in slices (`prefill_slice`, the server's) also saves the state at the end of a
# slice this many tokens or more past the last state saved (a host copy, into the same ladder):
# an edit inside one long message (a pasted file, a 20k-token system prompt) recomputes from the
# slice before it, not from the message's start.
SAVE_EVERY_TOKENS = 4096
# ... and one more where the prompt's first message ends (its first end-of-turn token: the system
# prompt and tools) if that is ANCHOR_MIN_TOKENS or more, kept while the session's history holds
# it: an edit anywhere after it, or another conversation with the same system prompt
# (Session.take_prefix), starts from there. (The prompt's first forward pass ends there, which on
# the GPU streams the expert banks a prompt needs once more.)
ANCHOR_MIN_TOKENS = 64


def ladder(lengths: list[int], keep: int, floor: int = 0) -> list[int]:
    """Which saved states to keep (`lengths`: where each was saved, ascending), at most `keep`: the
    newest always; the others dropped one at a time by the least loss for the distance back, where
    dropping the state at L makes a departure just after it resume from the one before it (or
    `floor`: the first message's end, or nothing), `L - previous` more tokens computed for a
    departure `newest - L` back. So the states kept thin out the further back they lie."""
    kept = sorted(lengths)
    while len(kept) > max(1, keep):
        del kept[min(range(len(kept) - 1), key=lambda i: _drop_loss(kept, i, floor))]
    return kept


def _drop_loss(kept: list[int], i: int, floor: int) -> float:
    """The tokens computed more for a departure just after kept[i] were it dropped, over how far
    back from the newest it lies."""
    previous = max(kept[i - 1] if i > 0 else 0, floor if floor <= kept[i] else 0)
    return (kept[i] - previous) / (kept[-1] - kept[i] + 1)


class EmptyPromptError(ValueError):
    """Generation was asked for with no prompt tokens."""


@dataclass
class GenerationStats:
    prompt_tokens: int = 0  # tokens actually prefilled (a reused prefix is not counted)
    cached_tokens: int = 0  # prompt tokens whose state was kept from before (a prefix cache hit)
    prompt_seconds: float = 0.0
    eval_tokens: int = 0
    eval_seconds: float = 0.0

    @property
    def prompt_tokens_per_second(self) -> float:
        return self.prompt_tokens / self.prompt_seconds if self.prompt_seconds else 0.0

    @property
    def eval_tokens_per_second(self) -> float:
        return self.eval_tokens / self.eval_seconds if self.eval_seconds else 0.0


@dataclass
class Generation:
    text: str
    tokens: list[int]
    stop_reason: str  # "stop" (EOS or a stop string), "length" (max_tokens), "context" (context full)
    stats: GenerationStats = field(default_factory=GenerationStats)
    stop_string: str | None = None  # the stop string that ended it (None: EOS, or no stop)


def common_prefix(a: list[int], b: list[int]) -> int:
    """The number of leading tokens `a` and `b` share."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:  # (the usual case, a continuation: one comparison in C)
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo], a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if a[:mid] == b[:mid] else (lo, mid)
    return lo



class Session:
    """One sequence of a loaded model; not thread-safe (the server queues requests per session)."""

    def __init__(self, model: DecoderModel, tokenizer: Tokenizer, context_length: int,
                 prefill_slice: int | None = None, state: DecodeState | None = None) -> None:
        """`prefill_slice`: a prompt's new tokens go to the model in forward passes of at most this
        many (None: all at once), so that concurrent generations of one model (the server's
        sessions) take turns between them and a long prompt does not hold up the others' tokens.
        `state`: another session's, taken over (`sharing`) instead of a new one."""
        self.model = model
        self.tokenizer = tokenizer
        self.context_length = context_length
        self.prefill_slice = prefill_slice
        self.state = model.new_state(context_length) if state is None else state
        self.tokens: list[int] = []  # what `state` holds
        self.saved: list[StateCheckpoint] = []  # a recurrent model's: the state at some of `tokens`' prefixes
        self.anchored: StateCheckpoint | None = None  # ... and where the first message ends
        self.prompt_length = 0  # of `tokens`, those of the last prompt (the rest: its reply)

    def reset(self) -> None:
        self.state = self.model.reset_state(self.state)  # emptied in place where it can be (CUDA graphs keep its buffers)
        self.tokens, self.saved, self.prompt_length, self.anchored = [], [], 0, None

    @property
    def checkpoints(self) -> list[StateCheckpoint]:
        """The saved states a recurrent model's session can be taken back to."""
        return ([self.anchored] if self.anchored is not None else []) + self.saved

    def _prefill(self, prompt: list[int], stats: GenerationStats) -> torch.Tensor:
        """Logits of the last prompt token, reusing the state when it holds a prefix of `prompt`."""
        if len(prompt) > self.context_length:
            raise ContextOverflowError(
                f"the prompt is {len(prompt)} tokens, the context is {self.context_length}; shorten it or raise num_ctx"
            )
        self._keep_prefix_of(prompt)
        new = prompt[len(self.tokens):]
        stats.cached_tokens, stats.prompt_tokens = len(self.tokens), len(new)
        start = time.perf_counter()
        if not getattr(self.model, "rewinds", True):  # its state saved where the last token begins
            anchor = self._first_message_end(prompt)
            if anchor is not None:
                self._feed(prompt[:anchor])
                self.anchored = self.model.checkpoint(self.state)
            self._feed(prompt[:-1], save_every=SAVE_EVERY_TOKENS)
            self._save_state()
        logits = self._feed(prompt)
        assert logits is not None  # (`reusable` keeps the last token out: it is always fed)
        self.prompt_length = len(prompt)
        stats.prompt_seconds = time.perf_counter() - start
        return logits

    def _feed(self, prompt: list[int], save_every: int | None = None) -> torch.Tensor | None:
        """Forward `prompt`'s tokens past those the state holds (`self.tokens`, a prefix of it), in
        slices of `prefill_slice`, `tokens` following each pass (so a pass refused part way, a
        cancelled generation's, leaves them in step with the state); the last token's logits.
        `save_every`: a recurrent state is saved after a slice that ends this many tokens or more
        past the last saved one (SAVE_EVERY_TOKENS)."""
        logits = None
        step = self.prefill_slice or len(prompt)
        while len(self.tokens) < len(prompt):
            piece = prompt[len(self.tokens): len(self.tokens) + step]
            logits = self.model.forward(torch.tensor(piece, dtype=torch.long), self.state, last_only=True)[-1]
            self.tokens = prompt[: len(self.tokens) + len(piece)]
            if save_every and len(self.tokens) < len(prompt):
                last_saved = max((s.length for s in self.checkpoints if s.length <= len(self.tokens)), default=0)
                if len(self.tokens) - last_saved >= save_every:
                    self._save_state()
        return logits

    def _first_message_end(self, prompt: list[int]) -> int | None:
        """Where `prompt`'s first message ends (after its first end-of-turn token), if the state
        has not passed it yet and the prompt goes on after it; None otherwise."""
        ends = self.tokenizer.eos_token_ids
        at = next((i + 1 for i, token in enumerate(prompt) if token in ends), None)
        held = self.anchored.length if self.anchored is not None else 0
        if at is None or at < ANCHOR_MIN_TOKENS or held >= at:
            return None
        return at if len(self.tokens) <= at < len(prompt) - 1 else None

    def _save_state(self) -> None:
        if any(s.length == len(self.tokens) for s in self.checkpoints):
            return
        saved = self.model.checkpoint(self.state)
        if saved is not None:
            states = [*self.saved, saved]
            keep = max(2, min(SAVED_STATES, SAVED_STATES_BYTES // max(1, checkpoint_bytes(saved))))
            kept = set(ladder([s.length for s in states], keep, self.anchored.length if self.anchored else 0))
            self.saved = [s for s in states if s.length in kept]

    def reusable(self, prompt: list[int]) -> int:
        """How many of `prompt`'s first tokens this session's state can keep, less at least its last
        token (whose logits start the reply): all it holds where `prompt` continues its tokens;
        where it departs from them (an edited or trimmed history, a retried turn, another request
        sharing the system prompt), the common prefix, where every layer's cache is read by
        position (`rewinds`: the state is taken back to it); a recurrent state is taken back only
        to a saved one within the common prefix (`saved`), else keeps nothing."""
        keep = min(common_prefix(self.tokens, prompt), len(prompt) - 1)
        if keep < len(self.tokens) and not getattr(self.model, "rewinds", False):  # (a model that does not say cannot)
            return max((s.length for s in getattr(self, "checkpoints", ()) if s.length <= keep), default=0)
        return keep

    def take_prefix(self, other: Session, length: int) -> bool:
        """This session holding `other`'s first `length` tokens, their state copied
        (DecoderModel.copy_prefix; a recurrent model's from `other`'s state saved at `length`):
        a conversation that shares a prompt prefix with another starts from it. False, this
        session unchanged, where the model's caches cannot be copied so."""
        copy = getattr(self.model, "copy_prefix", None)
        saved = None
        if not getattr(self.model, "rewinds", False):
            saved = next((s for s in other.checkpoints if s.length == length), None)
            if saved is None:
                return False
        if copy is None or length > len(other.tokens) or not copy(other.state, self.state, length, saved):
            return False
        self.tokens, self.saved, self.prompt_length, self.anchored = other.tokens[:length], [], length, saved
        return True

    def park_into(self, store: BlockStore) -> bool:
        """This session's conversation stored in `store` (prefix_blocks.py): the blocks of its
        tokens, those stored already shared and the others' rows copied from the state; a recurrent
        model's up to each of its saved states, each on the block where it ends. False where
        nothing could be stored."""
        park = getattr(self.model, "park_parts", None)
        if park is None or not self.tokens:
            return False
        if getattr(self.model, "rewinds", False):
            return store.insert(self.tokens, lambda spans: park(self.state, spans))
        stored = False
        for saved in self.checkpoints:
            stored |= store.insert(self.tokens[: saved.length], lambda spans, s=saved: park(self.state, spans, s), saved)
        return stored

    def unpark_blocks(self, found: Found) -> bool:
        """This session holding a prefix `store.lookup` found (its blocks' rows copied back in place,
        a recurrent model's state put back from the one saved where it ends)."""
        unpark = getattr(self.model, "unpark", None)
        if unpark is None or not unpark(found.state(), self.state):
            return False
        self.tokens, self.prompt_length = found.tokens(), found.length
        self.saved, self.anchored = [], found.saved
        return True

    def sharing(self, context_length: int | None = None) -> Session:
        """A session over this one's state (no new one allocated), holding what the state holds now:
        another generation's turn at a device's only state (server/time_share.py), this session's
        conversation stored first (`park_held`). `context_length`: the new one's, at most the state's."""
        length = self.state.length
        other = Session(self.model, self.tokenizer, min(context_length or self.context_length, self.state.max_tokens),
                        self.prefill_slice, state=self.state)
        other.tokens, other.prompt_length = self.tokens[:length], min(self.prompt_length, length)
        other.saved = [s for s in self.saved if s.length <= length]
        other.anchored = self.anchored if self.anchored is not None and self.anchored.length <= length else None
        return other

    def park_held(self, store: BlockStore) -> int | None:
        """At a turn boundary of this session's generation (between forward passes), what its state
        holds (`state.length` tokens: a decode step's token is in `tokens` before its pass) stored in
        `store` (only blocks not stored yet copied; a recurrent model's state saved there, at that
        length), so another conversation may use the state until `restore_held`. The length, or
        None, nothing stored, where it cannot be (no park_parts; a recurrent state that cannot be
        saved; a hash collision)."""
        park, length = getattr(self.model, "park_parts", None), self.state.length
        if park is None or not getattr(self.model, "can_park", True):
            return None
        if length == 0:
            return 0
        tokens = self.tokens[:length]
        if getattr(self.model, "rewinds", False):
            stored = store.insert(tokens, lambda spans: park(self.state, spans))
        else:
            saved = self.model.checkpoint(self.state)
            stored = saved is not None and store.insert(tokens, lambda spans: park(self.state, spans, saved), saved)
        return length if stored else None

    def restore_held(self, store: BlockStore, length: int) -> None:
        """The state holding this session's first `length` tokens again (`park_held` stored them;
        another conversation used the state since): the longest prefix of them still stored copied
        back, the rest (evicted since) computed again; `tokens`, `saved` and the rest unchanged."""
        kept = self.tokens, self.saved, self.anchored, self.prompt_length
        found = store.lookup(self.tokens[:length] + [-1], getattr(self.model, "rewinds", False)) if length else None
        if found is None or not self.unpark_blocks(found):
            self.reset()
        self._feed(kept[0][:length])
        self.tokens, self.saved, self.anchored, self.prompt_length = kept

    def _keep_prefix_of(self, prompt: list[int]) -> None:
        """The state holding `reusable(prompt)` tokens: taken back, or started over."""
        keep = self.reusable(prompt)
        if keep == len(self.tokens):
            return
        if keep == 0:
            self.reset()
            return
        if getattr(self.model, "rewinds", False):
            self.model.set_length(self.state, keep)
        else:
            self.model.restore(self.state, next(s for s in self.checkpoints if s.length == keep))
        self.tokens = self.tokens[:keep]
        self.prompt_length = min(self.prompt_length, keep)
        self.saved = [s for s in self.saved if s.length <= keep]  # (the others saved a history now gone)
        if self.anchored is not None and self.anchored.length > keep:
            self.anchored = None

    def generate(self, prompt: list[int], params: SamplingParams, on_text: OnText | None = None, *,
                 keep_special_tokens: bool = False, continues_text: bool = False) -> Generation:
        """Continue `prompt` until EOS, a stop string, max_tokens or the end of the context.
        `keep_special_tokens`: the text keeps special tokens the model writes (a family's tool-call
        markers are special tokens in some tokenizers: DeepSeek's, GLM's argument tags).
        `continues_text`: the output continues the prompt's last words (a raw prompt, a prefilled
        reply), so its text is decoded after theirs: "is" + "▁Paris" is " Paris", not "Paris"."""
        if not prompt:
            raise EmptyPromptError("the prompt is empty: give some text (an empty chat still renders a template)")
        stats = GenerationStats()
        logits = self._prefill(prompt, stats)
        sampler = Sampler(params)
        detok = IncrementalDetokenizer(self.tokenizer, skip_special_tokens=not keep_special_tokens,
                                       context=prompt[-CONTEXT_TOKENS:] if continues_text else ())
        stops = StopStringMatcher(list(params.stop))
        limit = params.max_tokens if params.max_tokens and params.max_tokens > 0 else None
        out_tokens: list[int] = []
        pieces: list[str] = []
        reason = "length"
        start = time.perf_counter()

        def emit(text: str) -> bool:
            shown, stopped = stops.feed(text)
            if shown:
                pieces.append(shown)
                if on_text:
                    on_text(shown)
            return stopped

        # a GPU model's steps run as graphs that can be queued ahead: the next step's launches are
        # made while this one runs, and it starts the moment its token is known (device_model.py)
        queue = getattr(self.model, "can_queue", False)
        pending = None  # the step queued for the next token
        try:
            while True:
                if limit is not None and len(out_tokens) >= limit:
                    reason = "length"
                    break
                token = sampler.sample(logits, self.tokens)
                if token in self.tokenizer.eos_token_ids:
                    reason = "stop"
                    break
                out_tokens.append(token)
                if emit(detok.push(token)):
                    reason = "stop"
                    break
                if len(self.tokens) + 1 >= self.context_length:  # prompt + answer fill the context
                    reason = "context"
                    break
                self.tokens.append(token)
                if not queue:
                    logits = self.model.forward(torch.tensor([token], dtype=torch.long), self.state)[-1]
                    continue
                step, pending = pending or self.model.queue_decode(self.state), None
                step.start(token, sampler.candidates_needed(self.tokens))  # the best logits only, where they decide
                # the next step queued while `step` runs, unless another generation waits for the
                # state (time_share.py): it may take it before the next step, which must not be queued
                if (limit is None or len(out_tokens) < limit) and len(self.tokens) + 1 < self.context_length \
                        and not getattr(self.model, "contended", False):
                    pending = self.model.queue_decode(self.state)
                logits = step.logits()
        finally:
            if pending is not None:  # queued for a token that did not come (its replay must run all the same)
                pending.cancel()
        if not stops.stopped:
            emit(detok.flush())
            tail = stops.flush()  # text held back in case it began a stop string
            if tail:
                pieces.append(tail)
                if on_text:
                    on_text(tail)
        stats.eval_tokens = len(out_tokens)
        stats.eval_seconds = time.perf_counter() - start
        return Generation("".join(pieces), out_tokens, reason, stats, stops.stop)
