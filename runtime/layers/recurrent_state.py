"""The per-sequence state of a recurrent mixer (one tensor every token moves on: LFM2's short
convolution window, MiniMax's lightning-attention key-value sums), which can continue its
sequence or start a new one, never rewind by itself; a host copy of it can be put back."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from .attention import DevicePosition, Start


class RecurrentRewindError(ValueError):
    """A recurrent state was asked to continue from a position it is not at."""


class ForwardOnlyState:
    """A per-sequence state that can start a new sequence or continue its own, never rewind:
    `length` tokens seen, `reset` empties it (RecurrentState, ConvMatrixState)."""

    length: int
    described_as: ClassVar[str] = "recurrent state"  # (in the rewind error)

    def seek(self, start: Start) -> None:
        """Start a forward at `start`: 0 begins a new sequence; anything else must continue this
        one. A DevicePosition (a captured decode step) continues it unchecked: its position is on
        the device, and the caller keeps `length` (DecoderModel.set_length)."""
        if isinstance(start, DevicePosition):
            return
        if start == 0:
            self.reset()
        elif start != self.length:
            raise RecurrentRewindError(
                f"a {self.described_as} at token {self.length} cannot continue from token {start}; "
                "recurrent layers cannot rewind: restart the sequence from token 0")

    def reset(self) -> None:
        """Empty for a new sequence, in place."""
        raise NotImplementedError


@dataclass
class RecurrentState(ForwardOnlyState):
    """One layer's state for one sequence, and how many tokens it has seen."""

    value: torch.Tensor
    length: int = 0

    def advance(self, start: Start, num_tokens: int) -> None:
        """The call from `start` has moved the state on by `num_tokens` (a DevicePosition's: the caller counts)."""
        if not isinstance(start, DevicePosition):
            self.length = start + num_tokens

    def reset(self) -> None:
        """Empty for a new sequence, in place (a captured step holds this buffer's address)."""
        self.value.zero_()
        self.length = 0

    def checkpoint(self) -> RecurrentState:
        """A host copy of this state as it is (the engine keeps one to take a departing prompt back to)."""
        return RecurrentState(self.value.to("cpu", copy=True), self.length)

    def restore(self, saved: RecurrentState) -> None:
        """This state as `saved` was, in place (a captured step holds this buffer's address)."""
        self.value.copy_(saved.value)
        self.length = saved.length


@dataclass
class ConvMatrixState(ForwardOnlyState):
    """One layer's state for one sequence of a mixer with a causal conv before a matrix-valued
    recurrence (Gated DeltaNet, KDA, Mamba2): the conv's last inputs and each head's state."""

    conv: torch.Tensor  # [conv_dim, kernel - 1], compute dtype
    recurrent: torch.Tensor  # [heads, ...], float32 (as transformers keeps it)
    length: int = 0

    def reset(self) -> None:
        """Empty for a new sequence, in place (a captured step holds these buffers' addresses)."""
        self.conv.zero_()
        self.recurrent.zero_()
        self.length = 0

    def checkpoint(self) -> ConvMatrixState:
        """A host copy of this state as it is (the engine keeps one to take a departing prompt back to)."""
        return type(self)(self.conv.to("cpu", copy=True), self.recurrent.to("cpu", copy=True), self.length)

    def restore(self, saved: ConvMatrixState) -> None:
        """This state as `saved` was, in place (a captured step holds these buffers' addresses)."""
        self.conv.copy_(saved.conv)
        self.recurrent.copy_(saved.recurrent)
        self.length = saved.length
