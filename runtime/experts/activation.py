"""An expert's activation computed: h = act(gate, up) for the kinds of ftw.format.ExpertActivation.

A bank's layout names its experts' activation (`ExpertBank.activation`, written by the converter
from the family's config). The compiled CPU kernel computes every kind (its `Act`, in
csrc/moe_cpu.cpp), as does the GPU slot kernel (runtime/gpu/kernels/slot_experts.py, its ACT
codes); the Triton grouped-GEMM kernel computes plain
"swiglu" only (`plain`), and the device paths route other banks to their torch forms here.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ftw.format import SWIGLU, ExpertActivation


def plain(activation: ExpertActivation) -> bool:
    """Whether `activation` is silu(gate) * up, the one the compiled kernels compute."""
    return activation == SWIGLU


def activate(activation: ExpertActivation, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """act(gate, up) elementwise, in the inputs' dtype (gate and up: the [..., I] halves of w13 x)."""
    if activation.kind == "swiglu":
        return F.silu(gate) * up
    if activation.kind == "geglu_tanh":  # (Gemma 4)
        return F.gelu(gate, approximate="tanh") * up
    assert activation.limit is not None  # (the index parser and the converter refuse one without)
    gate, up = gate.clamp(max=activation.limit), up.clamp(min=-activation.limit, max=activation.limit)
    if activation.kind == "swiglu_limited":  # (DeepSeek-V4)
        return F.silu(gate) * up
    if activation.kind == "swiglu_clamped":  # (gpt-oss)
        return gate * torch.sigmoid(gate * activation.alpha) * (up + 1)
    raise ValueError(f"expert activation {activation.kind!r} has no runtime computation")


def describe(activation: ExpertActivation) -> str:
    """The activation in words, for refusals."""
    return activation.kind if activation.limit is None else f"{activation.kind} (limit {activation.limit:g})"
