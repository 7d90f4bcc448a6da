"""From a registered model to a runnable one: weights in memory, experts behind an executor."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from registry import Store

from .config import ModelConfig
from .experts import CPUExpertExecutor
from .loader import ModelWeights, load_weights
from .models import DecoderModel, build_model, keep_float32
from .weights import RegisteredModel, open_model


@dataclass
class LoadedModel:
    registered: RegisteredModel
    weights: ModelWeights
    model: DecoderModel

    @property
    def config(self) -> ModelConfig:
        return self.weights.config


def load_registered(registered: RegisteredModel, dtype: torch.dtype = torch.float32) -> LoadedModel:
    """Load every weight of `registered` (CPU backend: experts run from the host banks)."""
    with registered.open_ftw() as reader:
        weights = load_weights(reader, dtype, keep_float32=keep_float32(reader.index.family))
    model = build_model(weights.config, weights, CPUExpertExecutor(weights.banks, dtype), dtype)
    return LoadedModel(registered, weights, model)


def load(store: Store, name: str, dtype: torch.dtype = torch.float32) -> LoadedModel:
    return load_registered(open_model(store, name), dtype)
