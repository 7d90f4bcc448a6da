"""A sequence's state copied outside its own forward passes: its first tokens into another state
(a conversation that shares a prompt prefix with another starts from it), or into host memory
and back (a conversation parked while another one uses the device's only state).

What can be copied is what is read by position: each tensor of such a cache has a row a position
(attention's keys and values, MLA's latents), so the first `length` rows are the first `length`
tokens. A recurrent layer's state is one summary of every token so far; it is taken from a
`StateCheckpoint` saved at exactly `length` tokens (DecoderModel.checkpoint). Any other cache (a
state of a step's own, a tensor of another shape) makes the state not copyable: nothing is copied.

A parked state is kept as parts, each a run of positions: a block store's blocks
(prefix_blocks.py) are parts, and a prefix found there goes back into a state as one parked state
of them, so a switch between conversations moves only the rows not stored yet off the device.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from .state import DecodeState, StateCheckpoint


@dataclass(frozen=True)
class ParkedPart:
    """The rows of positions [start, start + rows[0].shape[0]) of each positional cache tensor (in
    `positional_rows` order), in host memory."""

    start: int
    rows: tuple[torch.Tensor, ...]

    @property
    def end(self) -> int:
        return self.start + (self.rows[0].shape[0] if self.rows else 0)

    @property
    def nbytes(self) -> int:
        return sum(r.numel() * r.element_size() for r in self.rows)


@dataclass(frozen=True)
class ParkedState:
    """A state's first `length` tokens in host memory: its positional caches' rows, in parts that
    follow one another from position 0 to `length`, and a recurrent model's caches saved at
    `length`."""

    length: int
    parts: tuple[ParkedPart, ...]
    saved: StateCheckpoint | None


def checkpoint_bytes(saved: StateCheckpoint | None) -> int:
    """Host bytes of a recurrent model's saved caches (0: none saved)."""
    return 0 if saved is None else sum(_bytes(c) for c in saved.caches.values())


def positional_rows(state: DecodeState, skip: set[int] | dict) -> list[torch.Tensor] | None:
    """Every tensor of `state`'s caches but those at the indices in `skip`, where each has a row a
    position and their other fields are plain values; None where a cache is not so."""
    rows: list[torch.Tensor] = []
    for index, cache in enumerate(state.caches):
        if index in skip:
            continue
        found = _tensors(cache, state.max_tokens)
        if found is None:
            return None
        rows += found
    return rows


def copyable(rewinds: bool, state: DecodeState, length: int, saved: StateCheckpoint | None) -> bool:
    """Whether `state`'s first `length` tokens can be copied: it holds them, and a recurrent
    model's saved state is at exactly `length`."""
    if not rewinds and (saved is None or saved.length != length):
        return False
    return not state.extra and 0 <= length <= state.length


def copy_state_prefix(rewinds: bool, source: DecodeState, target: DecodeState, length: int,
                saved: StateCheckpoint | None) -> bool:
    """`target`'s caches holding `source`'s first `length` tokens (the caller sets its length)."""
    recurrent = saved.caches if saved is not None else {}
    if not copyable(rewinds, source, length, saved) or target.extra or source.max_tokens != target.max_tokens:
        return False
    rows, into = positional_rows(source, recurrent), positional_rows(target, recurrent)
    if rows is None or into is None or [r.shape for r in rows] != [t.shape for t in into]:
        return False
    for row, to in zip(rows, into, strict=True):
        to[:length].copy_(row[:length])
    for index, copy in recurrent.items():
        target.caches[index].restore(copy)
    return True


def park_parts(rewinds: bool, state: DecodeState, spans: list[tuple[int, int]],
               saved: StateCheckpoint | None) -> list[ParkedPart] | None:
    """The rows of each span [start, end) of `state`'s positions copied to host memory, a part a
    span, each its own memory (prefix_blocks.py evicts them one by one); None where they cannot be
    copied. A recurrent model's (`rewinds` False) needs `saved`, a state of it saved at any
    length, to tell its recurrent caches (not copied here) from its positional ones."""
    if not rewinds and saved is None:
        return None
    rows = positional_rows(state, saved.caches if saved is not None else {})
    if rows is None or state.extra or any(not 0 <= start < end <= state.length for start, end in spans):
        return None
    _settle(rows)
    return [ParkedPart(start, tuple(r[start:end].to("cpu", copy=True) for r in rows)) for start, end in spans]


def _fits(parked: ParkedState, rows: list[torch.Tensor]) -> bool:
    """Whether `parked`'s parts are rows of tensors shaped as `rows` (the same model's state)."""
    return all(len(p.rows) == len(rows) and all(h.shape[1:] == r.shape[1:] and h.dtype == r.dtype
                                                for h, r in zip(p.rows, rows, strict=True)) for p in parked.parts)


def unpark_state(parked: ParkedState, state: DecodeState) -> bool:
    """`state`'s caches holding the parked tokens again (the caller sets its length); False,
    nothing copied, where the state's caches are not those it was parked from."""
    recurrent = parked.saved.caches if parked.saved is not None else {}
    into = positional_rows(state, recurrent)
    if into is None or state.extra or not _fits(parked, into) or any(t.shape[0] < parked.length for t in into):
        return False
    _settle(into)
    for part in parked.parts:
        for row, to in zip(part.rows, into, strict=True):
            to[part.start: part.end].copy_(row)
    for index, copy in recurrent.items():
        state.caches[index].restore(copy)
    _settle(into)
    return True


def _settle(tensors: list[torch.Tensor]) -> None:
    """The device done with every queued write to `tensors` (a decode step's, on a stream of its
    own) before they are read or written here, and with these copies before the next step."""
    device = next((t.device for t in tensors if t.is_cuda), None)
    if device is not None:
        torch.cuda.synchronize(device)


def _tensors(cache: Any, rows: int, depth: int = 3) -> list[torch.Tensor] | None:
    if isinstance(cache, torch.Tensor):
        return [cache] if cache.dim() > 0 and cache.shape[0] == rows else None
    if cache is None or isinstance(cache, (bool, int, float, str)):
        return []
    if depth == 0 or not hasattr(cache, "__dict__"):
        return None
    found: list[torch.Tensor] = []
    for value in vars(cache).values():
        more = _tensors(value, rows, depth - 1)
        if more is None:
            return None
        found += more
    return found


def _bytes(value: Any) -> int:
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, (list, tuple)):
        return sum(_bytes(v) for v in value)
    return sum(_bytes(v) for v in vars(value).values()) if hasattr(value, "__dict__") else 0
