"""From a registered model to a runnable one: weights in memory, experts behind an executor."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from registry import Store

from ..config import ModelConfig
from ..experts import CPUExpertExecutor
from ..experts.cpu_kernels import native_kernel
from ..models import DecoderModel, build_model, keep_float32
from ..planner.footprint import keeps_blocks
from .family_tensors import check_registered_index
from .read_ftw import ModelWeights, load_weights
from .registered import RegisteredModel, open_model

if TYPE_CHECKING:
    from ..gpu import DeviceModel, HybridExpertExecutor

BACKENDS = ("cpu", "gpu")


@dataclass
class LoadedModel:
    registered: RegisteredModel
    weights: ModelWeights
    model: DecoderModel | DeviceModel
    experts: HybridExpertExecutor | None = None  # the GPU backend's executor: stats, resize

    @property
    def config(self) -> ModelConfig:
        return self.weights.config


def load_registered(registered: RegisteredModel, dtype: torch.dtype = torch.float32, *, backend: str = "cpu",
                    **gpu_options: Any) -> LoadedModel:
    """Load every weight of `registered`.

    backend "cpu": everything in host memory, experts run from the host banks. "gpu": dense
    weights and decode state on the device, banks pinned in host memory, an expert cache in the
    VRAM left (runtime.gpu.load_gpu: device, fit plan or vram_budget_bytes or cache_slots,
    mode, profile, ...); the model families are the same, only the executor differs."""
    if backend not in BACKENDS:
        raise ValueError(f"backend is one of {', '.join(BACKENDS)}, not {backend!r}")
    # the CPU kernel (experts, decode's dense products, attention, the GPU's CPU share) is compiled
    # for this CPU on first use: made here, it counts as loading, not as the first prompt's time
    # (a first run showed "prompt eval duration: 8.080s (1.36 tokens/s)")
    native_kernel()
    registered.check_files()
    with registered.open_ftw() as reader:  # (its index checked as a download's is, then by its family's build)
        check_registered_index(reader.index, registered.unusable)
    if backend == "gpu":
        from ..gpu import load_gpu

        weights, device_model, executor = load_gpu(registered, dtype, **gpu_options)
        return LoadedModel(registered, weights, device_model, executor)
    with registered.open_ftw() as reader:
        weights = load_weights(reader, dtype, keep_float32=keep_float32(reader.index.family), keep_blocks=keeps_blocks)
    model = build_model(weights.config, weights, CPUExpertExecutor(weights.banks, dtype), dtype)
    return LoadedModel(registered, weights, model)


def load(store: Store, name: str, dtype: torch.dtype = torch.float32, **options: Any) -> LoadedModel:
    return load_registered(open_model(store, name), dtype, **options)
