"""A family's DecoderModel run on the GPU, unchanged: dense weights and decode state on the device.

Families create small tensors as they go (positions, masks, decode state) with torch's factory
functions and no device; inside `torch.device(device)` those land on the device. Building the
model, making its state and each forward run in that context, so no family knows about devices.
The price is torch's device-mode hook on every op (a few microseconds per op on the host); a
device argument through base.py and the layers would remove it.
"""

from __future__ import annotations

from typing import Any

import torch

from ..loader import ModelWeights
from ..models import DecoderModel, DecodeState


def move_dense(weights: ModelWeights, device: torch.device) -> ModelWeights:
    """The same weights with every dense tensor on `device` (experts stay in host banks)."""
    return ModelWeights(weights.config, {name: t.to(device) for name, t in weights.dense.items()}, weights.banks)


class DeviceModel:
    """`model` with its state and every forward on `device`; logits come back on the device
    (the sampler moves the one row it needs)."""

    def __init__(self, model: DecoderModel, device: torch.device | str) -> None:
        self.model = model
        self.device = torch.device(device)

    def new_state(self, max_tokens: int) -> DecodeState:
        with torch.device(self.device):
            return self.model.new_state(max_tokens)

    def forward(self, input_ids: torch.Tensor, state: DecodeState, last_only: bool = False) -> torch.Tensor:
        with torch.device(self.device):
            return self.model.forward(input_ids.to(self.device), state, last_only)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.model, name)
