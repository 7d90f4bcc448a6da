"""An expert's activation computed: h = act(gate, up) for the kinds of ftw.format.ExpertActivation.

A bank's layout names its experts' activation (`ExpertBank.activation`, written by the converter
from the family's config). The compiled CPU kernel computes every kind (its `Act`, in
csrc/moe_cpu.cpp), as does the GPU slot kernel (runtime/gpu/kernels/slot_experts.py, its ACT
codes); the Triton grouped-GEMM prefill kernels compute plain "swiglu" (`plain`), the MXFP4 one
also the clamped forms with biases (gpt-oss's), and the device paths route other banks to their
torch forms here.

A kind that is not gated ("relu2", Nemotron-H's; "silu", Doge's) has one projection before down:
its records' w13 holds the up rows alone ([I, H], not [2I, H]), so `split_rows` gives no gate and
`activate` reads `up` alone.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ftw.format import SWIGLU, ExpertActivation


def plain(activation: ExpertActivation) -> bool:
    """Whether `activation` is silu(gate) * up, the one the compiled kernels compute."""
    return activation == SWIGLU


def split_rows(activation: ExpertActivation, h: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor]:
    """(gate, up) [..., I] of h = w13 x [..., 2I] (or of the w13 biases); (None, h) where the
    experts are not gated (h is up's [..., I])."""
    if not activation.gated:
        return None, h
    gate, up = h.chunk(2, dim=-1)
    return gate, up


def activate(activation: ExpertActivation, gate: torch.Tensor | None, up: torch.Tensor) -> torch.Tensor:
    """act(gate, up) elementwise, in the inputs' dtype (gate and up: the [..., I] halves of w13 x;
    gate None for a kind that is not gated)."""
    if activation.kind == "relu2":  # (Nemotron-H: relu(up)^2, as transformers' ReLUSquaredActivation)
        return F.relu(up).square()
    if activation.kind == "silu":  # (Doge's retrieval experts: silu(down_embed x))
        return F.silu(up)
    assert gate is not None, f"{activation.kind} experts are gated"
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
