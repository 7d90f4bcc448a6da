"""Streaming text out of generated tokens: incremental detokenization and stop strings.

Byte-level BPE splits multi-byte characters (emoji, CJK) across tokens, and SentencePiece-style
decoders strip a leading space at the start of whatever they decode, so decoding one token at a
time is wrong. `IncrementalDetokenizer` uses the offset scheme of Hugging Face TGI and vLLM:
decode a window that starts a few tokens back twice, without and with the new tokens, and emit
the difference once it no longer ends in U+FFFD (an incomplete character). The pieces add up to
`decode(all ids)`: for byte-level BPE on any id sequence, for byte-fallback decoders on any that
decodes to valid UTF-8 (they replace a run of invalid bytes as a whole, which pieces cannot see).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

REPLACEMENT_CHAR = "\ufffd"


class _Decoder(Protocol):
    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str: ...


class IncrementalDetokenizer:
    """Turns a stream of token ids into text pieces whose concatenation is `decode(all ids)`, or
    with `context` (ids the stream continues, not emitted) the text the stream adds to theirs:
    where a reply continues text (a raw prompt, an assistant's prefilled words), a SentencePiece
    token's leading space is the space between the context's word and its own. Without context
    it starts a new text, whose first leading space decoders strip."""

    def __init__(self, tokenizer: _Decoder, *, skip_special_tokens: bool = True, context: Sequence[int] = ()) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.ids: list[int] = [int(i) for i in context]
        self._prefix_offset = 0  # where the decode window starts
        self._read_offset = len(self.ids)  # ids before this have been emitted as text (or were context)

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)

    def _step(self, final: bool) -> str:
        prefix = self._decode(self.ids[self._prefix_offset : self._read_offset])
        text = self._decode(self.ids[self._prefix_offset :])
        if len(text) > len(prefix) and (final or not text.endswith(REPLACEMENT_CHAR)):
            self._prefix_offset, self._read_offset = self._read_offset, len(self.ids)
            return text[len(prefix) :]
        return ""

    def push(self, token_id: int) -> str:
        """Add one token; returns the text it completes (often "", e.g. mid-character)."""
        self.ids.append(int(token_id))
        return self._step(final=False)

    def flush(self) -> str:
        """Text still held back at the end of generation (an incomplete character decodes as U+FFFD)."""
        return self._step(final=True)


class StopStringMatcher:
    """Cuts streamed text at the first stop string, so that no stop string reaches the output.

    Text that could still turn into a stop string is held back until it either does (then it is
    dropped with everything after it) or cannot (then it is emitted). Empty stop strings are ignored.
    """

    def __init__(self, stops: list[str] | tuple[str, ...]) -> None:
        self.stops = tuple(s for s in dict.fromkeys(stops) if s)
        self._held = ""
        self.stopped = False
        self.stop: str | None = None  # the stop string that matched

    def feed(self, text: str, final: bool = False) -> tuple[str, bool]:
        """Add streamed text; returns (text safe to emit now, whether a stop string was reached).

        `final=True` marks the end of generation: whatever was held back is released too.
        """
        if self.stopped:
            return "", True
        buffer = self._held + text
        # The stop that completes first wins (then the longer one), as if text came a character
        # at a time: so the result does not depend on how the text was split into feeds.
        hits = [(at + len(stop), at, stop) for stop in self.stops if (at := buffer.find(stop)) >= 0]
        if hits:
            _, at, self.stop = min(hits)
            self._held, self.stopped = "", True
            return buffer[:at], True
        keep = 0 if final else self._partial_suffix(buffer)
        self._held = buffer[len(buffer) - keep :] if keep else ""
        return buffer[: len(buffer) - keep], False

    def flush(self) -> str:
        """Text held back because it might have started a stop string; call when generation ends."""
        held, self._held = ("" if self.stopped else self._held), ""
        return held

    def _partial_suffix(self, buffer: str) -> int:
        """Length of the longest end of `buffer` that begins some stop string."""
        longest = max((len(s) for s in self.stops), default=0)
        for k in range(min(len(buffer), longest - 1), 0, -1):
            tail = buffer[-k:]
            if any(stop.startswith(tail) for stop in self.stops):
                return k
        return 0
