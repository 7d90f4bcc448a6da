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


def routed_chunk(bank, num_tokens: int = 20, top_k: int = 2):
    """A prompt chunk over `bank` for the grouped kernels' tests: the records as rows wider than a
    record (cache slots: 0xFF bytes beside), on DEVICE, and a routing where expert 2 is hot (more
    pairs than one 16-row tile) and the last expert gets no pair. Returns (records, views, plan, x,
    weights)."""
    from runtime.gpu.records import PairPlan, RecordViews

    experts, stride = bank.num_experts, bank.layout.expert_stride
    hidden = next(p.shape[1] for p in bank.layout.parts if p.name in ("w13", "w1"))
    records = torch.full((experts, stride + 96), 0xFF, dtype=torch.uint8)
    records[:, :stride] = bank.data
    rows = records.to(DEVICE)[:, :stride]
    gen = torch.Generator().manual_seed(8)
    chosen = []
    for t in range(num_tokens):
        perm = torch.randperm(experts - 1, generator=gen)
        if t < 18:
            perm = torch.cat([torch.tensor([2]), perm[perm != 2]])
        chosen.append(perm[:top_k])
    ids = torch.stack(chosen)
    weights = torch.softmax(torch.randn(num_tokens, top_k, generator=gen), dim=-1)
    x = torch.randn(num_tokens, hidden, generator=gen)
    plan = PairPlan.build(ids, torch.arange(experts), lambda t: t.to(DEVICE))
    return rows, RecordViews(rows, bank.layout), plan, x.to(DEVICE), weights.to(DEVICE)


def plan_args(plan, weights: torch.Tensor, dtype: torch.dtype, idle_row: int) -> dict:
    """A grouped kernel's plan arguments, with an expert of zero pairs (`idle_row`) among them."""
    zero = torch.zeros(1, dtype=torch.int64, device=plan.rows.device)
    return {"rows": torch.cat([plan.rows[:2], zero + idle_row, plan.rows[2:]]),
            "starts": torch.cat([plan.starts[:2], plan.starts[2:3], plan.starts[2:]]),
            "counts": torch.cat([plan.counts[:2], zero, plan.counts[2:]]), "tokens": plan.tokens,
            "pair_weights": weights.reshape(-1)[plan.pairs].to(dtype).float(), "max_count": max(plan.counts_host)}


def assert_matches_twin_and_padded_runs(chunk, dtype: torch.dtype, kernel, twin, parts: dict) -> None:
    """A grouped prefill kernel's check on `chunk` (routed_chunk's records, views, plan, x, weights):
    the dispatch CUDA takes (records.grouped_call) reaches `kernel`; its output, with an idle expert
    among the plan's, is `twin`'s (called with the records' `parts`) up to fp32 summation order
    (1e-4 of max|out|), and the padded runs' of records.experts_from_records within their extra
    roundings (2% in bf16, 0.5% in f16)."""
    from runtime.gpu.records import experts_from_records, grouped_call

    records, views, plan, x, weights = chunk
    assert max(plan.counts_host) > 16 and len(plan.rows_host) == 5
    call = grouped_call(views, dtype)
    assert call is not None and call.func is kernel
    args = plan_args(plan, weights, dtype, idle_row=5)
    ours = torch.zeros(x.shape, dtype=torch.float32, device=DEVICE)
    call(x.to(dtype), records, **args, out=ours)
    expected = torch.zeros_like(ours)
    twin(x.to(dtype), records, **parts, **args, out=expected)
    padded = torch.zeros_like(ours)
    experts_from_records(x, weights, plan, views, dtype, padded)  # (on CPU tensors: the padded runs)
    scale = expected.abs().max().item()
    assert torch.isfinite(ours).all() and scale > 0
    assert (ours - expected).abs().max().item() <= 1e-4 * scale
    assert (ours - padded).abs().max().item() <= (0.02 if dtype == torch.bfloat16 else 0.005) * scale
