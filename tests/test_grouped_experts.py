"""Grouped prefill experts (runtime/gpu/kernels/grouped_experts*.py): the Triton kernel against its
torch twin, and the twin against the padded-runs path of records.experts_from_records.

Without CUDA the kernel runs under TRITON_INTERPRET=1 on CPU tensors at tiny shapes
(tests/kernels.py). Kernel and twin differ in fp32 summation order, and so in the rounding of
the activation to the compute dtype; the twin and the padded runs (which round gate|up to the
compute dtype before the activation) within 2% of max|out|.
"""

from __future__ import annotations

import pytest
import torch

from runtime.experts.synthetic import random_bank
from runtime.gpu.kernels.grouped_experts_ref import grouped_experts_ref, tile_rows
from runtime.gpu.records import PairPlan, RecordViews, experts_from_records
from tests.kernels import DEVICE, import_kernel, needs

DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16}

grouped_experts = import_kernel("grouped_experts", "grouped_experts")
needs_triton = needs(grouped_experts)


def _call(records: torch.Tensor, views: RecordViews, plan: PairPlan, x: torch.Tensor, weights: torch.Tensor,
          dtype: torch.dtype) -> dict:
    return {"x": x.to(dtype), "records": records, **views.float_parts(), "rows": plan.rows, "starts": plan.starts,
            "counts": plan.counts, "tokens": plan.tokens,
            "pair_weights": weights.reshape(-1)[plan.pairs].to(dtype).float(), "max_count": max(plan.counts_host)}


def _setup(dtype: str, hidden: int, inter: int, num_tokens: int, top_k: int = 4, experts: int = 12,
           slot_pad: int = 0, seed: int = 0):
    """Records of `experts` experts as rows of a bank buffer (`slot_pad` > 0: rows wider than a
    record, as cache slots are), and one prompt chunk's routing planned over every expert."""
    bank = random_bank(dtype, experts, hidden, inter, seed=seed)
    stride = bank.layout.expert_stride
    records = torch.full((experts, stride + slot_pad), 0xFF, dtype=torch.uint8)  # NaN where no record is
    records[:, :stride] = bank.data
    records = records.to(DEVICE)
    gen = torch.Generator().manual_seed(seed + 1)
    chosen = []
    for t in range(num_tokens):
        perm = torch.randperm(experts, generator=gen)
        if t < num_tokens // 2:  # one hot expert: many pairs, several M tiles
            perm = torch.cat([torch.tensor([3]), perm[perm != 3]])
        chosen.append(perm[:top_k])
    ids = torch.stack(chosen)
    weights = torch.softmax(torch.randn(num_tokens, top_k, generator=gen), dim=-1)
    x = torch.randn(num_tokens, hidden, generator=gen)
    plan = PairPlan.build(ids, torch.arange(experts), lambda t: t.to(DEVICE))
    rows = records[:, :stride]  # (with slot_pad: rows of a wider tensor, as lent cache slots are)
    return rows, RecordViews(rows, bank.layout), plan, x.to(DEVICE), weights.to(DEVICE), ids.to(DEVICE)


def test_tile_rows_fits_the_mean_count() -> None:
    assert [tile_rows(m) for m in (1, 16, 17, 32, 33, 500)] == [16, 16, 32, 32, 64, 64]


@needs_triton
@pytest.mark.parametrize("dtype", ["bf16", "f16"])
@pytest.mark.parametrize("hidden,inter,tokens", [(64, 32, 40), (96, 80, 70), (128, 64, 150)])
def test_the_kernel_matches_its_twin(dtype: str, hidden: int, inter: int, tokens: int) -> None:
    """Tiles past an expert's count (the hot expert's several M tiles beside one-pair experts),
    I and H not multiples of the 64-wide tiles, and record rows wider than a record (slots)."""
    records, views, plan, x, weights, _ = _setup(dtype, hidden, inter, tokens, slot_pad=256)
    args = _call(records, views, plan, x, weights, DTYPES[dtype])
    ours = torch.zeros(tokens, hidden, dtype=torch.float32, device=DEVICE)
    ref = torch.zeros_like(ours)
    grouped_experts(**args, out=ours)
    grouped_experts_ref(**args, out=ref)
    assert torch.isfinite(ours).all()
    # the activation is rounded to the compute dtype: an fp32 sum in another order may round it one
    # unit in the last place the other way (2^-8 of it in bf16, 2^-11 in f16)
    scale = (2e-2 if dtype == "bf16" else 3e-3) * ref.abs().max().item()
    torch.testing.assert_close(ours, ref, rtol=0, atol=scale)


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
def test_the_twin_matches_the_padded_runs_of_experts(dtype: str) -> None:
    records, views, plan, x, weights, ids = _setup(dtype, 64, 32, 48)
    torch_dtype = DTYPES[dtype]
    ref = torch.zeros(48, 64, dtype=torch.float32, device=DEVICE)
    grouped_experts_ref(**_call(records, views, plan, x, weights, torch_dtype), out=ref)
    padded = torch.zeros_like(ref)
    experts_from_records(x.cpu() if DEVICE == "cpu" else x, weights, plan, views, torch_dtype, padded)
    assert (padded - ref).abs().max() <= 0.02 * ref.abs().max()


def test_bad_arguments_are_refused_with_what_is_wrong() -> None:
    records, views, plan, x, weights, _ = _setup("bf16", 64, 32, 8)
    args = _call(records, views, plan, x, weights, torch.bfloat16)
    out = torch.zeros(8, 64, dtype=torch.float32, device=DEVICE)
    with pytest.raises(ValueError, match="x is"):
        grouped_experts_ref(**{**args, "x": args["x"].float()}, out=out)
    with pytest.raises(ValueError, match="do not fit"):
        grouped_experts_ref(**{**args, "w2_offset": records.shape[1]}, out=out)
    with pytest.raises(ValueError, match="out is fp32"):
        grouped_experts_ref(**args, out=out.to(torch.bfloat16))
