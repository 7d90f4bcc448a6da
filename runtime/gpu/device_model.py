"""A family's DecoderModel run on the GPU, unchanged: dense weights and decode state on the device.

Families create small tensors as they go (positions, masks, decode state) with torch's factory
functions and no device; inside `torch.device(device)` those land on the device. Building the
model, making its state and each forward run in that context, so no family knows about devices.
The price is torch's device-mode hook on every op (a few microseconds per op on the host), paid
in prefill and in decode steps that run uncaptured.

A one-token forward of a model whose mixers take a DevicePosition runs as one CUDA graph per
step (step_graphs.py, through the executor): the token and its position go into two device
buffers, and attention reads a span of the KV cache, the next power of two above the position
(at least SPAN_MIN), masked past it. One graph per span serves every position under it.
"""

from __future__ import annotations

from typing import Any

import torch

from ..layers.attention import DevicePosition
from ..loader import ModelWeights
from ..models import DecoderModel, DecodeState
from .step_graphs import StepGraphs

SPAN_MIN = 256  # the shortest KV span a captured step attends over


def move_dense(weights: ModelWeights, device: torch.device) -> ModelWeights:
    """The same weights with every dense tensor on `device` (experts stay in host banks)."""
    return ModelWeights(weights.config, {name: t.to(device) for name, t in weights.dense.items()}, weights.banks)


def decode_span(position: int, max_tokens: int) -> int:
    """The KV positions a captured step at `position` attends over (masked past it)."""
    return min(max_tokens, max(SPAN_MIN, 1 << position.bit_length()))


class DeviceModel:
    """`model` with its state and every forward on `device`; logits come back on the device
    (the sampler moves the one row it needs). `steps`: the executor's StepGraphs, to run decode
    steps as CUDA graphs (None: every forward eager)."""

    def __init__(self, model: DecoderModel, device: torch.device | str, steps: StepGraphs | None = None) -> None:
        self.model = model
        self.device = torch.device(device)
        self.steps = steps if steps is not None and steps.enabled and model.takes_device_position else None
        self._token = torch.zeros(1, dtype=torch.long, device=self.device)
        self._position = torch.zeros(1, dtype=torch.long, device=self.device)
        self._graph_state: DecodeState | None = None  # the state the step graphs were captured over

    def new_state(self, max_tokens: int) -> DecodeState:
        with torch.device(self.device):
            return self.model.new_state(max_tokens)

    def reset_state(self, state: DecodeState) -> DecodeState:
        with torch.device(self.device):
            return self.model.reset_state(state)

    def forward(self, input_ids: torch.Tensor, state: DecodeState, last_only: bool = False) -> torch.Tensor:
        # inference mode around the step's host part too (begin_step, end_step): the tensors it
        # creates and updates in place must all be inference tensors, as the model's are
        with torch.device(self.device), torch.inference_mode():
            if self.steps is not None and input_ids.numel() == 1 and state.length < state.max_tokens:
                return self._decode_step(input_ids, state)
            return self.model.forward(input_ids.to(self.device), state, last_only)

    def _decode_step(self, input_ids: torch.Tensor, state: DecodeState) -> torch.Tensor:
        assert self.steps is not None
        if state is not self._graph_state:  # the graphs write the old state's KV buffers
            self.steps.invalidate()
            self._graph_state = state
        position = state.length
        span = decode_span(position, state.max_tokens)
        self._token.copy_(input_ids.reshape(1), non_blocking=True)
        self._position.fill_(position)
        where = DevicePosition(self._position, span)
        logits = self.steps.run(("decode", span), lambda: self.model.decode_at(self._token, where, state))
        self.model.set_length(state, position + 1)
        return logits.clone()  # the graph's own buffer is rewritten by the next step

    def __getattr__(self, name: str) -> Any:
        return getattr(self.model, name)
