"""Importing a Triton kernel in a test: compiled on a GPU, interpreted without one.

tests/conftest.py sets TRITON_INTERPRET=1 on a machine without CUDA before any module imports
triton (triton picks interpreted or compiled helpers when it is first imported, and reads the
variable again on later launches), so here a kernel module only has to be imported.
"""

from __future__ import annotations

import importlib

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
DEVICE = "cuda" if HAS_CUDA else "cpu"


def import_kernel(module: str, name: str):
    """`name` from runtime.gpu.kernels.`module`; None without triton (the test then skips)."""
    try:
        return getattr(importlib.import_module(f"runtime.gpu.kernels.{module}"), name)
    except ImportError:
        return None


def needs(kernel) -> pytest.MarkDecorator:
    return pytest.mark.skipif(kernel is None, reason="triton is not installed")


def gathered_pairs(views, x: torch.Tensor, token: torch.Tensor, slot: torch.Tensor,
                   weight: torch.Tensor) -> torch.Tensor:
    """The reference of a decode call's device pairs: each pair with a slot adds its routing weight
    times its expert (RecordViews' float32 weights and biases, records.swiglu_experts with the
    bank's activation) on its token's row."""
    from runtime.gpu.records import swiglu_experts

    out = torch.zeros(x.shape, dtype=torch.float32)
    for t, s, w in zip(token.tolist(), slot.tolist(), weight.tolist(), strict=True):
        if s >= 0:
            w13, w2 = views.weights(s, torch.float32)
            biases = views.biases(s, torch.float32)
            out[t] += w * swiglu_experts(x[t: t + 1].float(), w13, w2, views.layout.activation, biases)[0, 0]
    return out
